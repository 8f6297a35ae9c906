"""A MemoryX shard's arithmetic on a step's gradients: a tied tensor's parts added in unit order, and a
gradient's sum of squares in float64. Both run the same way in every store and on any thread, so the
bits do not depend on where or when they run (memoryx/gradients.py runs them early, in the background)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import numpy as np

from weightstream.memoryx.store import TensorStore
from weightstream.numerics.optim import add_sq_sum

__all__ = ["add_parts", "added_sq_sum", "background_sum", "sq_sum_of"]


def background_sum(store: TensorStore, parts: list[str], key: str | None) -> Callable[[], float]:
    """What gives the sum of squares of a complete gradient held in ``store`` (a memory store: views),
    to run on another thread: its one part, or ``parts`` (in unit order) added into ``key`` first. A tied
    tensor's last part is the embedding's, the last of backward: added only when the norm was asked, the
    addition lay on the step's critical path (~2-3 ms at GPT-2 d512/L4's 4M embedding weights). Views
    stay valid when the store drops them (a reset), and a shard runs the next attempt's sum after it."""
    if key is None:
        return partial(sq_sum_of, list(store.blocks(parts[0])))
    arrays = [store.get(k).reshape(-1) for k in (key, *parts)]
    return partial(added_sq_sum, arrays, list(store.blocks(key)))


def add_parts(blocks: list[np.ndarray]) -> None:
    """``blocks``: the sum's flat block, then the same block of each part in unit order: sum = the parts
    added in that order (never arrival order)."""
    total, first, second, *rest = blocks
    np.add(first, second, out=total)  # one pass: the bits of total = first; total += second
    for p in rest:
        total += p


def added_sq_sum(parts: list[np.ndarray], blocks: list[np.ndarray]) -> float:
    """``add_parts(parts)`` over whole flat arrays, then the sum's sum of squares by its store ``blocks``."""
    add_parts(parts)
    return sq_sum_of(blocks)


def sq_sum_of(blocks: Iterable[np.ndarray]) -> float:
    """Sum of squares of a tensor given as its consecutive flat blocks (the store's), in float64."""
    per_tensor = 0.0
    for block in blocks:
        per_tensor = add_sq_sum(per_tensor, block)
    return per_tensor

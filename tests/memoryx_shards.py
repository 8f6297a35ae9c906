"""MemoryX shards for the tests of memoryx/: a shard of the TINY model (or its state alone, in a store of the
test's choice), a step's gradients into it, a gate that holds its update before a tensor, and a call run in
a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.store import TensorStore
from weightstream.numerics import ModelDef
from weightstream.numerics.sparse_masks import SparsitySpec
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs

# what a test waits at most for a call to block or a thread to end (a pass takes milliseconds)
WAIT_S = 10.0


def tiny_shard(
    raw: dict[str, Any] = TINY,
    timeout_s: float = 10,
    storage: Path | None = None,
    resume: Path | None = None,
) -> tuple[MemoryXShard, ModelDef]:
    """A shard holding every tensor of ``raw``'s model (sparse if it says so), and the model: in memory, or
    on disk in ``storage``; seeded (7), or loaded from the checkpoint ``resume``."""
    p = load_params(raw)
    model = model_def(p)
    shard = MemoryXShard(
        model,
        optimizer_config(p.optimizer),
        list(model.specs),
        seed=7,
        timeout_s=timeout_s,
        resume_dir=None if resume is None else str(resume),
        storage_dir=storage,
        sparsity=tiny_sparsity(raw, model),
    )
    return shard, model


def tiny_sparsity(raw: dict[str, Any], model: ModelDef) -> dict[str, SparsitySpec] | None:
    """The sparsity of each tensor of ``model`` that ``raw`` asks for (None: dense)."""
    p = load_params(raw)
    return sparsity_specs(p, model) if p.sparsity is not None else None


def tiny_state(store: TensorStore, raw: dict[str, Any] = TINY) -> ShardState:
    """The state of a shard holding every tensor of ``raw``'s model in ``store``, empty (``fill``: filled)."""
    p = load_params(raw)
    model = model_def(p)
    specs = sparsity_specs(p, model) if p.sparsity is not None else None
    return ShardState(model, optimizer_config(p.optimizer), list(model.specs), store, specs)


def gradients_in(shard: MemoryXShard, model: Any, step: int) -> None:
    """Every unit's gradients of ``step`` (random, seeded by the step) into ``shard``, unit by unit."""
    rng = np.random.default_rng(step)
    for u, unit in enumerate(model.units):
        grads = {}
        for n in unit.param_names:
            shape = shard.held.shape(n)  # compact where sparse, as a worker sends it
            grads[n] = rng.standard_normal(shape).astype(np.float32)
        shard.add_gradient(step, u, grads)


def gate(shard: MemoryXShard, name: str) -> tuple[threading.Event, threading.Event]:
    """Make the shard's update stop before tensor ``name`` until ``go`` is set (``reached`` says it is
    there)."""
    reached, go = threading.Event(), threading.Event()
    update: Callable[..., None] = shard.store.update

    def gated(keys: Sequence[str], fn: Callable[[list[np.ndarray]], None], write: Sequence[str]) -> None:
        if keys[0] == name:
            reached.set()
            assert go.wait(WAIT_S)
        update(keys, fn, write)

    shard.store.update = gated  # type: ignore[method-assign]  # the instance's, for this test only
    return reached, go


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``fn`` started in a thread of its own; the list gets what it returns."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out

"""Dropout whose masks are a pure function of (seed, step, global sample index, site).

Why not one generator per call: a step's global batch is split into contiguous shards across N workers,
each shard into micro-batches, and a worker short of memory runs a unit's forward again in backward. A
mask drawn from a stream consumed call after call would change with N, the micro-batch size and the call
order. Here each sample's mask at each site comes from its own generator,
``default_rng([seed, step, global sample index, site_id(site)])``, so every worker, micro-batch and
recomputation draws exactly the rows of the mask the whole batch would have drawn on one worker.

Units keep the signature ``forward(params, x)``; the caller says which samples ``x`` holds with a context:

    with dropout_scope(seed, step, first_sample=offset):  # offset: global index of x's row 0 in the step
        y, saved = unit.forward(params, x)

With no scope active (evaluation, inference) dropout is the identity, as in ``model.eval()``. A scope is
a ``contextvars.ContextVar``: it is seen by the thread (or task) that set it, not by threads it starts.

Masks are bool arrays [B, ...] (kept = uniform >= rate, kept values scaled by 1 / (1 - rate), as
``torch.nn.functional.dropout``); units keep them in ``saved`` for backward (1 byte per element).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from weightstream.numerics._blocked import for_row_blocks, rows2, run_tasks

__all__ = [
    "DropoutScope",
    "active_scope",
    "dropout_add_bias_residual",
    "dropout_backward",
    "dropout_forward",
    "dropout_mask",
    "dropout_scope",
    "site_id",
]


@dataclass(frozen=True)
class DropoutScope:
    """Which masks a forward draws: row ``i`` of its input is sample ``first_sample + i`` of step ``step``."""

    seed: int
    step: int
    first_sample: int


_SCOPE: ContextVar[DropoutScope | None] = ContextVar("weightstream_dropout_scope", default=None)


def _non_negative_int(name: str, value: int) -> int:
    if isinstance(value, bool):  # a bool is an int to Python, never a meaningful seed or index here
        raise TypeError(f"dropout_scope {name} must be an int (got {value!r})")
    try:
        v = operator.index(value)  # ints and numpy integers; floats are refused, not truncated
    except TypeError:
        raise TypeError(f"dropout_scope {name} must be an int (got {value!r})") from None
    if v < 0:  # SeedSequence takes non-negative entropy only
        raise ValueError(f"dropout_scope {name} must be >= 0 (got {v})")
    return v


@contextmanager
def dropout_scope(seed: int, step: int, first_sample: int) -> Iterator[DropoutScope]:
    """Forwards inside draw dropout masks for step ``step`` (a training step), with row 0 of their input
    being the global sample ``first_sample`` of that step's batch and the rows after it consecutive.
    Nested scopes replace the outer one until they exit."""
    scope = DropoutScope(
        _non_negative_int("seed", seed),
        _non_negative_int("step", step),
        _non_negative_int("first_sample", first_sample),
    )
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def active_scope() -> DropoutScope | None:
    """The scope the current context runs under, or None (dropout off)."""
    return _SCOPE.get()


def site_id(site: str) -> int:
    """A stable 64-bit id of a dropout site's name (the same in every process and Python version, unlike
    ``hash``). 64 bits rather than crc32's 32, so no two sites of any real model share their masks."""
    return int.from_bytes(hashlib.blake2b(site.encode(), digest_size=8).digest(), "little")


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate < 1.0:  # also refuses NaN
        raise ValueError(f"dropout rate must be in [0, 1) (got {rate!r})")


def dropout_mask(site: str, shape: tuple[int, ...], rate: float) -> np.ndarray | None:
    """The keep-mask (bool, ``shape`` = [B, ...]) of site ``site`` for the B samples the active scope
    names, or None where dropout does nothing (``rate`` 0, or no scope active).

    Row ``i`` depends on (seed, step, first_sample + i, site) and the row shape only: never on B, the
    worker, the micro-batch or how often it is drawn. A float32 uniform per element (resolution 2^-24, so
    the keep probability is 1 - rate to within 6e-8), kept where >= rate."""
    if rate == 0.0:  # before anything else: rate 0 must cost nothing
        return None
    _check_rate(rate)
    scope = _SCOPE.get()
    if scope is None:
        return None
    mask = np.empty(shape, dtype=np.bool_)  # [B, ...]
    sid = site_id(site)
    threshold = np.float32(rate)

    def draw(i: int) -> None:
        rng = np.random.default_rng([scope.seed, scope.step, scope.first_sample + i, sid])
        np.greater_equal(rng.random(shape[1:], dtype=np.float32), threshold, out=mask[i])

    # One task per sample, each with its own generator, so the thread count changes no bit (numpy's
    # generators release the GIL while they fill).
    run_tasks([partial(draw, i) for i in range(shape[0])])
    return mask


def _scale(rate: float, dtype: np.dtype[np.floating[Any]]) -> np.floating[Any]:
    _check_rate(rate)
    return dtype.type(1.0 / (1.0 - rate))


def dropout_forward(
    x: np.ndarray, mask: np.ndarray, rate: float, out: np.ndarray | None = None
) -> np.ndarray:
    """x * mask / (1 - rate), in one pass over row blocks; ``out`` may be ``x``."""
    x2, m2 = rows2(x), rows2(mask)
    y2 = np.empty_like(x2) if out is None else rows2(out)
    scale = _scale(rate, x.dtype)

    def rows(s: slice) -> None:
        ys = np.multiply(x2[s], m2[s], out=y2[s])
        ys *= scale

    for_row_blocks(rows, x2.shape[0], x2.shape[1])
    return y2.reshape(x.shape)


def dropout_backward(
    dy: np.ndarray, mask: np.ndarray, rate: float, out: np.ndarray | None = None
) -> np.ndarray:
    """dx = dy * mask / (1 - rate): the same masks and scale as forward. ``out`` may be ``dy``."""
    return dropout_forward(dy, mask, rate, out=out)


def dropout_add_bias_residual(
    y: np.ndarray, b: np.ndarray, mask: np.ndarray, rate: float, residual: np.ndarray
) -> np.ndarray:
    """y = (y + b) * mask / (1 - rate) + residual, in place, in one pass over y: a projection's output
    through Hugging Face GPT-2's ``resid_dropout`` (which follows the bias) and then its residual."""
    y2, m2, r2 = rows2(y), rows2(mask), rows2(residual)
    scale = _scale(rate, y.dtype)

    def rows(s: slice) -> None:
        ys = y2[s]
        ys += b
        ys *= m2[s]
        ys *= scale
        ys += r2[s]

    for_row_blocks(rows, y2.shape[0], y2.shape[1])
    return y

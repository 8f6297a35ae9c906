"""Dynamic sparsity's two schedules (``algorithm: gmp``), as cerebras.pytorch defines them.

Gradual magnitude pruning (GMP, Zhu & Gupta 2017) makes a sparse weight's mask again at *update steps*:
the entries of largest magnitude are kept, as many as the level of zeros the *level schedule* gives at that
step allows. Pruned weights are zero, so while the level rises they stay pruned, and the mask only shrinks.

Steps are counted as updates applied (1-based after the first optimizer step), as cerebras.pytorch's
``DynamicSparsityAlgorithm.update`` counts them: after the optimizer's k-th update, if ``is_update(k)``, the
mask is made again at ``level_at(k)``. Step 0 is the start: a run starts sparse at ``level_at(0)`` only if
step 0 is an update step (``update: {freq: ...}`` with no ``start``), and dense otherwise.

Levels are computed in float32 with cerebras.pytorch's formulas and clamped to [0, 1]; the entries kept of
a tensor are ``int((1 - level) * numel)`` in float32 (its ``make_mask_topk_sparsity``). ``exp``, ``pow`` and
``cos`` are taken in float64 and rounded: within one float32 ulp of torch's (bitwise equal in 97-100% of
steps measured), so a kept count can differ from a Cerebras run's by one entry, rarely.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

__all__ = ["LEVEL_KINDS", "LevelKind", "LevelSchedule", "UpdateSchedule", "gmp_kept", "largest_positions"]

LevelKind = Literal["linear", "exp", "power", "cosine"]
LEVEL_KINDS: tuple[str, ...] = get_args(LevelKind)  # the Literal's values, in order
_F32 = np.float32


@dataclass(frozen=True)
class LevelSchedule:
    """The level of zeros at a step. ``linear``: init + step * slope; ``exp``: final - (final - init) *
    exp(step * gamma); ``power``: init * beta ** step; ``cosine``: from init down to minimum and back every
    2 * half_period steps."""

    kind: LevelKind
    init: float
    slope: float = 0.0  # linear
    gamma: float = 0.0  # exp
    final: float = 1.0  # exp
    beta: float = 1.0  # power
    half_period: float = 1.0  # cosine
    minimum: float = 0.0  # cosine

    def __post_init__(self) -> None:
        if self.kind not in LEVEL_KINDS:
            raise ValueError(f"level schedule type must be one of {LEVEL_KINDS} (got {self.kind!r})")
        if self.kind == "cosine" and self.half_period == 0:
            raise ValueError("a cosine level schedule needs a half_period other than 0")

    def at(self, step: int) -> np.float32:
        """The level at ``step``, float32, clamped to [0, 1] (the float32 arithmetic of cerebras.pytorch's
        ``Linear``/``Exp``/``Power``/``Cosine``, whose tensors are float32 and whose step is converted)."""
        level: np.float32 = self.levels(np.array([step], dtype=np.int64))[0]
        return level

    def levels(self, steps: np.ndarray) -> npt.NDArray[np.float32]:
        """``at`` of every one of ``steps`` (int64), as float32: one code path for one step and many, so
        validation (every update step of a run) sees exactly the levels training will."""
        s = steps.astype(_F32)
        v: npt.NDArray[np.float32]
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            # exp, pow and cos in float64 rounded to float32: as close to torch's float32 ones as numpy gets
            # (numpy's own float32 SIMD loops are up to 2 ulp off them, and may differ between CPUs)
            if self.kind == "linear":
                v = _F32(self.init) + s * _F32(self.slope)
            elif self.kind == "exp":
                final = _F32(self.final)
                v = final - (final - _F32(self.init)) * np.exp(
                    (s * _F32(self.gamma)).astype(np.float64)
                ).astype(_F32)
            elif self.kind == "power":
                v = _F32(self.init) * np.power(np.float64(_F32(self.beta)), s.astype(np.float64)).astype(_F32)
            else:  # cosine: offset and amplitude from Python floats, as the class computes them
                offset = (self.minimum + self.init) / 2
                angle = (s * _F32(math.pi / self.half_period)).astype(np.float64)
                v = _F32(self.init - offset) * np.cos(angle).astype(_F32) + _F32(offset)
        nan = np.flatnonzero(np.isnan(v))
        if len(nan):  # an infinity clamps, as torch.clamp does; a NaN would count no entries
            raise ValueError(f"the sparsity level schedule gives NaN at step {int(steps[nan[0]])}")
        return np.clip(v, _F32(0.0), _F32(1.0)).astype(_F32)


@dataclass(frozen=True)
class UpdateSchedule:
    """The steps at which masks are made again: every ``freq`` steps from ``start`` (default 0) up to, not
    including, ``stop``; or exactly the ``steps`` listed."""

    freq: int = 1
    start: int = 0
    stop: int | None = None
    steps: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.freq < 1:
            raise ValueError(f"update freq must be at least 1 (got {self.freq})")
        if self.steps is not None:  # sorted, once: is_update bisects (a file may list many steps)
            object.__setattr__(self, "steps", tuple(sorted(set(self.steps))))

    def is_update(self, step: int) -> bool:
        if self.steps is not None:
            i = bisect.bisect_left(self.steps, step)
            return i < len(self.steps) and self.steps[i] == step
        due = (step - self.start) % self.freq == 0 and step >= self.start
        return due and (self.stop is None or step < self.stop)

    def update_steps(self, max_steps: int, first: int = 0) -> np.ndarray:
        """Every update step in [first, max_steps], ascending (int64)."""
        if self.steps is not None:
            return np.array(sorted({s for s in self.steps if first <= s <= max_steps}), dtype=np.int64)
        end = max_steps + 1 if self.stop is None else min(max_steps + 1, self.stop)
        lo = self.start + max(0, -(-(first - self.start) // self.freq)) * self.freq  # the first due >= first
        return np.arange(lo, max(end, lo), self.freq, dtype=np.int64)

    def last_update(self, max_steps: int) -> int | None:
        """The last update step in [0, max_steps], or None if there is none."""
        if self.steps is not None:
            inside = [s for s in self.steps if 0 <= s <= max_steps]
            return max(inside) if inside else None
        end = max_steps if self.stop is None else min(max_steps, self.stop - 1)
        if end < self.start:
            return None
        return end - (end - self.start) % self.freq


def gmp_kept(numel: int, level: float | np.float32) -> int:
    """Entries kept of ``numel`` at ``level``: ``int((1 - level) * numel)`` in float32, as
    ``make_mask_topk_sparsity`` counts them."""
    return int((_F32(1.0) - _F32(level)) * _F32(numel))


def largest_positions(weight: np.ndarray, kept: int) -> np.ndarray:
    """The flat positions of the ``kept`` entries of largest magnitude, ascending (ties: the lower position
    wins). Pruned entries are zero, so they come last. A partition, not a sort: O(entries), as gmp makes
    every sparse weight's mask again at each update step."""
    mag = np.abs(weight.reshape(-1))
    if kept >= mag.size:
        return np.arange(mag.size, dtype=np.int64)
    if kept <= 0:
        return np.empty(0, dtype=np.int64)
    threshold = np.partition(mag, mag.size - kept)[mag.size - kept]  # the kept-th largest magnitude
    above = np.flatnonzero(mag > threshold)
    ties = np.flatnonzero(mag == threshold)[: kept - len(above)]  # the lowest positions of the tie
    return np.sort(np.concatenate([above, ties])).astype(np.int64)

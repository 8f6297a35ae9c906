"""ModelZoo's learning-rate schedules as references: the closed forms of cerebras.pytorch 2.10 (ModelZoo
Release 2.10's LR schedulers: ``ExponentialScheduler``, ``PolynomialScheduler``, ``CosineDecayScheduler``
and ``SequentialScheduler`` in ``cerebras/pytorch/optim/scheduler.py``) transcribed op for op with torch,
where ``last_epoch`` is the 0-based step; and ``ours``, weightstream's schedule in the same shape."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from weightstream.numerics.optim import SchedulePiece, learning_rate_at

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)

Reference = Callable[[int], float]


# ---------------------------------------------------------------------------------------------------------
# ModelZoo's formulas (cerebras.pytorch 2.10), last_epoch = t
# ---------------------------------------------------------------------------------------------------------
def mz_exponential(
    init: float, total_iters: int, decay_rate: float, staircase: bool, dtype: Any = torch.float64
) -> Reference:
    def lr(t: int) -> float:
        power = torch.div(torch.tensor(t, dtype=dtype), total_iters)
        if staircase:
            power.floor_()
        return float(torch.pow(torch.tensor(decay_rate, dtype=dtype), power).mul(init))

    return lr


def mz_polynomial(
    init: float, end: float, total_iters: int, power: float, cycle: bool, dtype: Any = torch.float64
) -> Reference:
    def lr(t: int) -> float:
        step = torch.tensor(t, dtype=dtype)
        alpha = torch.tensor(1.0, dtype=dtype)
        if cycle:
            alpha = torch.add(step, 1).div(total_iters).ceil()
        decayed = torch.sub(1, torch.div(step, torch.mul(alpha, total_iters))).pow(power)
        return float(
            torch.where(step >= total_iters, torch.tensor(end, dtype=dtype), decayed * (init - end) + end)
        )

    return lr


def mz_cosine(init: float, end: float, total_iters: int) -> Reference:
    def lr(t: int) -> float:
        step = torch.minimum(
            torch.tensor(total_iters, dtype=torch.float64), torch.tensor(t, dtype=torch.float64)
        )
        progress = torch.mul(step, math.pi / total_iters).cos().add(1).mul(0.5)
        return float(progress * (init - end) + end)

    return lr


def mz_sequential(pieces: Sequence[Reference], total_iters: Sequence[int]) -> Reference:
    """SequentialLR with the milestones ModelZoo derives when a file leaves them out (the running sums of
    every piece's total_iters but the last's): piece i + 1 starts at t = 0 on its milestone."""
    milestones = np.cumsum(total_iters[:-1]).tolist()

    def lr(step: int) -> float:
        value = pieces[0](step)
        for i, milestone in enumerate(milestones):
            if step >= milestone:
                value = pieces[i + 1](step - milestone)
        return value

    return lr


def ours(pieces: Sequence[SchedulePiece]) -> Reference:
    return lambda step: learning_rate_at(pieces, step)

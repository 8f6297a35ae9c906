"""Learning-rate schedules: ModelZoo's Exponential and Polynomial pieces, step for step against its formulas.

The references (tests/modelzoo_schedules.py) transcribe the closed forms of cerebras.pytorch 2.10 op for op
with torch. ModelZoo evaluates them in float32; weightstream in float64, so the float64 transcription must
agree bitwise and the float32 one to float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.modelzoo_schedules import mz_cosine, mz_exponential, mz_polynomial, mz_sequential, ours
from weightstream.numerics.optim import SchedulePiece, learning_rate_at

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)


def steps_around(total_iters: int) -> list[int]:
    """Every step of the first four periods, then some far past the end."""
    return [*range(4 * total_iters + 2), 10 * total_iters - 1, 10 * total_iters, 25 * total_iters + 3]


# ---------------------------------------------------------------------------------------------------------
# The numerics
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("staircase", [False, True])
@pytest.mark.parametrize("decay_rate", [0.5, 0.96, 1.25, 0.0])
def test_exponential_is_modelzoos_formula(decay_rate: float, staircase: bool) -> None:
    """Bitwise ModelZoo's float64 closed form at every step, past total_iters too (a last piece keeps
    decaying there), and its float32 evaluation to float32 rounding."""
    piece = SchedulePiece("Exponential", 3e-3, 3e-3, 7, decay_rate=decay_rate, staircase=staircase)
    steps = steps_around(7)
    got = [ours([piece])(t) for t in steps]
    assert got == [mz_exponential(3e-3, 7, decay_rate, staircase)(t) for t in steps]
    f32 = [mz_exponential(3e-3, 7, decay_rate, staircase, torch.float32)(t) for t in steps]
    assert_allclose(got, f32, rtol=3e-6, atol=1e-30)


def test_staircase_decays_once_per_total_iters() -> None:
    stair = SchedulePiece("Exponential", 1.0, 1.0, 4, decay_rate=0.5, staircase=True)
    smooth = SchedulePiece("Exponential", 1.0, 1.0, 4, decay_rate=0.5)
    assert [stair.at(t) for t in range(10)] == [1.0] * 4 + [0.5] * 4 + [0.25] * 2
    assert smooth.at(2) == 0.5**0.5 and smooth.at(4) == 0.5 and smooth.at(6) == 0.5**1.5


def test_exponential_growth_past_float_range_is_inf_not_an_error() -> None:
    """decay_rate > 1 long past the end overflows float64: inf (as ModelZoo's float32 does much
    earlier), never an exception that would stop MemoryX mid-run."""
    piece = SchedulePiece("Exponential", 1e-3, 1e-3, 1, decay_rate=2.0)
    assert learning_rate_at([piece], 5000) == math.inf
    assert learning_rate_at([piece], 10) == 2.0**10 * 1e-3


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0, 2.0, 3.7])
def test_polynomial_is_modelzoos_formula(power: float) -> None:
    """Decay and warm-up (end above initial) alike; the end value exactly from total_iters on."""
    for init, end in [(1e-2, 1e-4), (0.0, 3e-3)]:
        piece = SchedulePiece("Polynomial", init, end, 9, power=power)
        steps = steps_around(9)
        got = [ours([piece])(t) for t in steps]
        assert got == [mz_polynomial(init, end, 9, power, False)(t) for t in steps]
        f32 = [mz_polynomial(init, end, 9, power, False, torch.float32)(t) for t in steps]
        assert_allclose(got, f32, rtol=3e-6, atol=1e-9)
        assert all(x == end for x in got[9:])


def test_polynomial_power_one_is_linear() -> None:
    """ModelZoo's LinearLR is PolynomialLR with power 1; our Linear keeps its own (older) float64 order
    of operations (kept bitwise), so the two agree to a few units in the last place of the larger rate."""
    for init, end in [(1e-2, 1e-4), (0.0, 3e-3)]:
        poly = SchedulePiece("Polynomial", init, end, 13, power=1.0)
        lin = SchedulePiece("Linear", init, end, 13)
        steps = steps_around(13)
        ulp = np.spacing(max(init, end))
        assert_allclose([poly.at(t) for t in steps], [lin.at(t) for t in steps], rtol=0, atol=4 * ulp)


def test_a_sequence_of_pieces_is_modelzoos_sequential_lr() -> None:
    """Each piece starts at t = 0 where the one before ends; the last (Exponential) keeps decaying. The
    pieces jump where they meet, so a step given to the wrong piece shows."""
    pieces = [
        SchedulePiece("Linear", 0.0, 1e-2, 5),
        SchedulePiece("Polynomial", 8e-3, 1e-3, 10, power=2.0),
        SchedulePiece("CosineDecay", 2e-3, 6e-4, 6),
        SchedulePiece("Exponential", 5e-4, 5e-4, 4, decay_rate=0.5, staircase=True),
    ]
    reference = mz_sequential(
        [
            mz_polynomial(0.0, 1e-2, 5, 1.0, False),  # LinearLR
            mz_polynomial(8e-3, 1e-3, 10, 2.0, False),
            mz_cosine(2e-3, 6e-4, 6),
            mz_exponential(5e-4, 4, 0.5, True),
        ],
        [5, 10, 6, 4],
    )
    steps = [*range(40), 100, 1001]
    assert_allclose([ours(pieces)(t) for t in steps], [reference(t) for t in steps], rtol=1e-14, atol=1e-19)
    assert ours(pieces)(21) == 5e-4  # the last piece starts at t = 0 on its milestone, 5 + 10 + 6
    assert ours(pieces)(21 + 4 * 3) == 5e-4 * 0.5**3  # three whole periods into the last piece


def _schedule_before(pieces: Sequence[SchedulePiece], step: int) -> float:
    """learning_rate_at as it was before Exponential and Polynomial came (Constant, Linear, CosineDecay)."""

    def at(p: SchedulePiece, t: int) -> float:
        if p.scheduler == "Constant":
            return p.initial_learning_rate
        frac = min(t, p.total_iters) / p.total_iters
        lo, hi = p.end_learning_rate, p.initial_learning_rate
        if p.scheduler == "Linear":
            return hi + (lo - hi) * frac
        return lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * frac))

    start = 0
    for p in pieces:
        if step < start + p.total_iters:
            return at(p, step - start)
        start += p.total_iters
    return at(pieces[-1], pieces[-1].total_iters)


@pytest.mark.parametrize(
    "pieces",
    [
        [SchedulePiece("Linear", 0.0, 3e-3, 20), SchedulePiece("CosineDecay", 3e-3, 3e-4, 280)],
        [SchedulePiece("Linear", 3e-3, 1e-5, 7)],
        [SchedulePiece("CosineDecay", 1e-3, 0.0, 11)],
        [SchedulePiece("Linear", 0.0, 1e-3, 3), SchedulePiece("Constant", 1e-3, 1e-3, 1 << 62)],
        [SchedulePiece("Constant", 2e-3, 2e-3, 5), SchedulePiece("Linear", 2e-3, 1e-4, 9)],
        [SchedulePiece("Linear", 0.0, 1e-3, 4), SchedulePiece("CosineDecay", 5e-4, 0.0, 6)],  # a jump
    ],
    ids=["warmup+cosine", "linear", "cosine", "warmup+constant", "constant+linear", "jump"],
)
def test_existing_pieces_are_bitwise_unchanged(pieces: list[SchedulePiece]) -> None:
    steps = [*range(330), 1000, 10**6]
    assert [learning_rate_at(pieces, t) for t in steps] == [_schedule_before(pieces, t) for t in steps]

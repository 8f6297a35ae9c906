"""The in-process timings a calibration starts from: they run the real numerics and return sane rates."""

from __future__ import annotations

from tests.simulate_cases import SMALL_GPT2
from weightstream.params import load_params, model_def
from weightstream.simulate.measure import time_reduce, time_units, time_update


def test_unit_timings_cover_every_unit_per_sample() -> None:
    params = load_params(SMALL_GPT2)
    times = time_units(params, samples=2, repeats=1)
    assert len(times) == len(model_def(params).units)
    assert all(f >= 0 and b > 0 for f, b in times)
    # the head's forward includes the loss: never free
    assert times[-1][0] > 0


def test_update_and_reduce_rates_are_positive() -> None:
    params = load_params(SMALL_GPT2)
    assert time_update(params, repeats=1) > 1e5  # parameters/s: any machine does far more
    assert time_reduce(nbytes=1 << 20, children=2, repeats=1) > 1e7  # bytes/s

"""Stragglers (training/stragglers.py): each step's slowest worker and its ratio to the others' median, in
the step's record, and one warning per stretch of steps a worker holds back."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from weightstream.numerics.optim import OptimizerConfig, SchedulePiece
from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.records import StepRecord
from weightstream.training.stepping import StepDriver
from weightstream.training.stragglers import (
    STRAGGLER_MIN_LAG_S,
    STRAGGLER_RATIO,
    STRAGGLER_STEPS,
    StragglerWatch,
    host_named,
    slowest_worker,
)

OPT = OptimizerConfig("adamw", (SchedulePiece("Constant", 1e-3, 1e-3, 1 << 62),), max_gradient_norm=1.0)


def test_the_slowest_worker_over_the_median_of_the_others() -> None:
    assert slowest_worker([1.0, 3.0]) == (1, 3.0, 2.0)  # two workers: the other's time, not their mean
    assert slowest_worker([1.0, 1.0, 4.0, 2.0]) == (2, 4.0, 3.0)  # others 1, 1, 2: median 1
    assert slowest_worker([2.0, 2.0, 2.0]) == (0, 1.0, 0.0)  # a tie: the first, and no lag
    assert slowest_worker([0.5]) == (-1, 1.0, 0.0)  # one worker: no one to lag behind
    assert slowest_worker([]) == (-1, 1.0, 0.0)
    assert slowest_worker([0.0, 0.0]) == (0, 1.0, 0.0)
    worker, ratio, lag = slowest_worker([0.0, 2.0])  # the others took no time: a large ratio, not an error
    assert worker == 1 and ratio > 1e5 and lag == 2.0


def stretch(watch: StragglerWatch, steps: list[tuple[int, float]], lag_s: float = 1.0) -> list[int | None]:
    return [watch.observe(worker, ratio, lag_s) for worker, ratio in steps]


def test_a_worker_slow_for_three_steps_running_is_named_once() -> None:
    assert (STRAGGLER_RATIO, STRAGGLER_STEPS, STRAGGLER_MIN_LAG_S) == (1.5, 3, 0.1)
    watch = StragglerWatch()
    said = stretch(watch, [(1, 1.6), (1, 2.0), (1, 1.5), (1, 3.0), (1, 2.0), (1, 1.9)])
    assert said == [None, None, 1, None, None, None]  # once for the stretch, however long it lasts
    assert watch.run == 6


def test_a_new_stretch_is_named_again() -> None:
    watch = StragglerWatch()
    steps = [(1, 2.0)] * 3 + [(1, 1.2)] + [(1, 2.0)] * 3  # back under the ratio once: a new stretch
    assert stretch(watch, steps) == [None, None, 1, None, None, None, 1]
    steps = [(0, 2.0)] * 3 + [(1, 2.0)] * 3  # another worker the slowest: its own stretch
    assert stretch(StragglerWatch(), steps) == [None, None, 0, None, None, 1]


def test_interrupted_stretches_and_small_lags_are_not_stragglers() -> None:
    watch = StragglerWatch()
    steps = [(1, 2.0), (1, 2.0), (0, 2.0), (1, 2.0), (1, 1.49), (1, 2.0), (-1, 1.0), (1, 2.0), (1, 2.0)]
    assert stretch(watch, steps) == [None] * len(steps)
    assert stretch(StragglerWatch(), [(1, 1.4)] * 10) == [None] * 10
    # twice as slow, but a few hundredths of a second behind (small steps on a busy host): not named
    assert stretch(StragglerWatch(), [(1, 2.0)] * 10, lag_s=0.05) == [None] * 10


def test_a_change_of_the_worker_count_ends_a_stretch() -> None:
    """Slot 1 of 3 workers and slot 1 of 2 may be different processes: their steps make no one stretch."""

    def slow_slot_1(workers: int) -> StepRecord:
        return StepRecord(step=1, loss=4.0, learning_rate=1e-3, grad_norm=1.0, tokens=8, step_time_s=1.0,
                          worker_wait_s=0.1, worker_compute_s=0.9, update_s=0.01, worker_peak_rss_bytes=1,
                          worker_wire_bytes=1, workers=workers, slowest_worker=1, slowest_worker_ratio=2.0,
                          slowest_worker_lag_s=0.5)  # fmt: skip

    watch = StragglerWatch()
    said = [watch.observe_record(slow_slot_1(w)) for w in (3, 3, 2, 2, 2, 2)]
    assert said == [None, None, None, None, 1, None]
    steady = StragglerWatch()
    assert [steady.observe_record(slow_slot_1(3)) for _ in range(3)] == [None, None, 1]


@pytest.mark.parametrize(("ratio", "steps"), [(1.0, 3), (0.5, 3), (1.5, 0)])
def test_a_watch_that_could_name_every_worker_is_refused(ratio: float, steps: int) -> None:
    with pytest.raises(ValueError, match="straggler"):
        StragglerWatch(ratio, steps)


class ThreeWorkers:
    """A role plane whose three workers report ``times`` (compute_s, wait_s) each, in that order."""

    def __init__(self, times: list[tuple[float, float]]) -> None:
        self.times = times
        self._pool = ThreadPoolExecutor(2)
        self.workers, self.memoryx = self, self

    def submit(self, fn: Any) -> Future[Any]:
        return self._pool.submit(fn)

    def run_step(self, step: int) -> list[pb.RunStepReply]:
        return [pb.RunStepReply(loss=1.0, tokens=8, compute_s=c, wait_s=w) for c, w in self.times]

    def grad_norm_sq(self, step: int) -> list[float]:
        return [1.0]

    def apply_update(self, step: int, lr: float, clip: float, *, watch: bool = True) -> None:
        pass


def test_the_step_record_names_the_worker_the_step_waited_for() -> None:
    # worker 2 computes as fast as the others but waits 1.4 s on its link: its time is compute + wait
    roles = ThreeWorkers([(0.5, 0.1), (0.5, 0.0), (0.5, 1.4)])
    record = StepDriver(roles, OPT).step(0, next_is_step=False)  # type: ignore[arg-type]
    assert record.slowest_worker == 2
    assert record.slowest_worker_ratio == pytest.approx(1.9 / 0.55)
    assert record.slowest_worker_lag_s == pytest.approx(1.9 - 0.55)
    line = record.to_dict()
    assert list(line)[-3:] == ["slowest_worker", "slowest_worker_ratio", "slowest_worker_lag_s"]
    assert line["slowest_worker"] == 2


def test_a_straggler_is_named_by_its_host_name_else_its_address() -> None:
    assert host_named("h2/6a7d-boot/4026532325/0", "198.18.0.12:4000") == "h2"  # its Health reply's
    assert host_named("", "198.18.0.12:4000") == "198.18.0.12"  # it did not answer

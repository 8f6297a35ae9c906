"""The coordinator's step driver (training/stepping.py) against a role plane that records what it is asked,
in which order: a step's GradNormSq goes out while its RunStep still runs, the next step's RunStep before
this step's GradNormSq has ended when a step follows, never otherwise, and a diverged step applies no
update."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from weightstream.numerics.optim import OptimizerConfig, SchedulePiece, clip_coefficient
from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.divergence import TrainingDiverged
from weightstream.training.errors import RoleFault
from weightstream.training.stepping import StepDriver

OPT = OptimizerConfig("adamw", (SchedulePiece("Constant", 1e-3, 1e-3, 1 << 62),), max_gradient_norm=1.0)


class RecordingRoles:
    """A stand-in for ``RolePlane`` and its typed clients (``workers``, ``memoryx``): records each (method,
    step) call. GradNormSq(s) waits up to ``wait_s`` for RunStep(s + 1) to have been asked for, and records
    whether it had; RunStep(s) waits up to ``norm_wait_s`` for GradNormSq(s) to have been asked for, and
    records whether it had. ``watched``: (method, watch) of each ApplyUpdate."""

    def __init__(self, sq_sum: float = 4.0, wait_s: float = 0.0, norm_wait_s: float = 0.0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.sent_ahead: dict[int, bool] = {}  # step s -> RunStep(s + 1) asked for before GradNormSq(s) ended
        self.norm_during_step: dict[
            int, bool
        ] = {}  # step s -> GradNormSq(s) asked for before RunStep(s) ended
        self.sq_sum, self.wait_s, self.norm_wait_s = sq_sum, wait_s, norm_wait_s
        self.update_fails = False  # ApplyUpdate raises RoleFault (a shard lost during the update)
        self.updates: list[tuple[int, float, float, bool]] = []  # ApplyUpdate's (step, lr, clip, watch)
        self._lock = threading.Lock()
        self._runstep: dict[int, threading.Event] = {}
        self._norm: dict[int, threading.Event] = {}
        self._pool = ThreadPoolExecutor(4)
        self.workers, self.memoryx = self, self  # the clients: one recorder answers for both kinds

    def _event(self, step: int, method: str = "RunStep") -> threading.Event:
        with self._lock:
            return (self._runstep if method == "RunStep" else self._norm).setdefault(step, threading.Event())

    def _record(self, method: str, step: int) -> None:
        with self._lock:
            self.calls.append((method, step))

    def submit(self, fn: Any) -> Future[Any]:
        return self._pool.submit(fn)

    def run_step(self, step: int) -> list[pb.RunStepReply]:
        self._record("RunStep", step)
        self._event(step).set()
        self.norm_during_step[step] = self._event(step, "norm").wait(self.norm_wait_s)
        return [pb.RunStepReply(loss=2.5, tokens=16, compute_s=0.1, wait_s=0.01)]

    def grad_norm_sq(self, step: int) -> list[float]:
        self._record("GradNormSq", step)
        self._event(step, "norm").set()
        self.sent_ahead[step] = self._event(step + 1).wait(self.wait_s)
        return [self.sq_sum]

    def apply_update(self, step: int, lr: float, clip: float, *, watch: bool = True) -> None:
        self._record("ApplyUpdate", step)
        self.updates.append((step, lr, clip, watch))
        if self.update_fails:
            raise RoleFault("memoryx-0 died")


def test_the_next_steps_runstep_is_sent_before_this_steps_gradient_norm() -> None:
    roles = RecordingRoles()
    driver = StepDriver(roles, OPT)  # type: ignore[arg-type]
    for step in range(3):
        roles.wait_s = 5.0 if step < 2 else 0.0  # no step 4 to wait for after step 3
        record = driver.step(step, next_is_step=step < 2)
        driver.committed()
        assert record.step == step + 1 and record.grad_norm == 2.0
    # the workers were asked for steps 1 and 2 while steps 0 and 1's norms were still being computed
    assert roles.sent_ahead == {0: True, 1: True, 2: False}
    assert driver.overlapped == 2
    runsteps = [s for m, s in roles.calls if m == "RunStep"]
    assert runsteps == [0, 1, 2]  # each step's RunStep once: the one sent ahead is the one used
    assert [s for m, s in roles.calls if m == "ApplyUpdate"] == [0, 1, 2]
    # the norm 2.0 is clipped to 1.0; only the shards take part in the update: no watch for lost workers
    coef = clip_coefficient([4.0], 1.0)[1]
    assert coef == pytest.approx(0.5) and roles.updates == [(step, 1e-3, coef, False) for step in range(3)]


def test_no_runstep_goes_ahead_of_a_step_that_is_not_next() -> None:
    roles = RecordingRoles()
    driver = StepDriver(roles, OPT)  # type: ignore[arg-type]
    driver.step(0, next_is_step=False)  # e.g. an evaluation or a checkpoint comes after step 1
    # RunStep(0) and GradNormSq(0) go out together (either may be recorded first), the update last
    assert sorted(roles.calls[:2]) == [("GradNormSq", 0), ("RunStep", 0)]
    assert roles.calls[2:] == [("ApplyUpdate", 0)]
    assert driver.overlapped == 0


def test_the_gradient_norm_is_asked_for_while_the_workers_still_run_the_step() -> None:
    """A shard answers GradNormSq(s) once its gradients are in: sent while RunStep(s) runs, it is back
    when the workers are, not a round trip after them. Both with the step's own RunStep and with one sent
    ahead during the previous update."""
    roles = RecordingRoles(norm_wait_s=5.0)
    driver = StepDriver(roles, OPT)  # type: ignore[arg-type]
    for step in range(3):
        roles.wait_s = 5.0 if step < 1 else 0.0
        record = driver.step(step, next_is_step=step < 1)  # step 1 sent ahead, step 2 not
        driver.committed()
        assert record.grad_norm == 2.0
    assert roles.norm_during_step == {0: True, 1: True, 2: True}
    assert driver.overlapped == 1


def test_a_diverged_step_applies_no_update() -> None:
    roles = RecordingRoles(sq_sum=float("inf"))
    driver = StepDriver(roles, OPT)  # type: ignore[arg-type]
    with pytest.raises(TrainingDiverged, match="step 1: the gradient norm is inf"):
        driver.step(0, next_is_step=True)
    assert ("ApplyUpdate", 0) not in roles.calls
    assert driver.interrupted() is None  # no update was in flight


def test_a_fault_during_the_update_hands_its_step_to_recovery_once() -> None:
    """The update may have landed on every shard: ``interrupted`` returns the step's record (its times
    still 0: the step never finished), then nothing; the RunStep sent ahead belongs to the configuration
    being replaced, so the next step sends its own."""
    roles = RecordingRoles()
    driver = StepDriver(roles, OPT)  # type: ignore[arg-type]
    roles.update_fails = True
    with pytest.raises(RoleFault):
        driver.step(0, next_is_step=True)
    record = driver.interrupted()
    assert record is not None and (record.step, record.loss, record.tokens) == (1, 2.5, 16)
    assert record.step_time_s == record.update_s == 0.0
    assert driver.interrupted() is None
    roles.update_fails = False
    driver.step(1, next_is_step=False)
    assert driver.overlapped == 0
    roles._pool.shutdown(wait=True)  # every call made, the one sent ahead included
    assert [s for m, s in roles.calls if m == "RunStep"] == [0, 1, 1]  # sent ahead, then its own

"""Elastic workers, end to end: a real job (every role a process, real training) loses a worker while its
backend has no room to start it again, goes on with fewer workers (``runconfig.min_num_csx``), and grows
back at a step boundary once there is room; its losses follow a fault-free run's to rounding. Without
``min_num_csx`` the same loss fails the job, saying why.

The runner runs in this process (``JobRunner``, as bench/chaos.py runs it) on the local backend, whose one
decision a local machine never makes, "no room for this worker now", a test double takes
(tests/integration/capacity.py).
"""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import weightstream.training.elastic as elastic_module
from tests.integration.capacity import NoRoomForWorkers
from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.backends.base import RoleSpec
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import load_params
from weightstream.training.errors import JobFailed
from weightstream.training.events import JobEvent, StepEvent, WorkersEvent
from weightstream.training.runner import JobRunner, job_log

STEPS = 40
KILL_AFTER = 4  # worker-1 is killed once step 4 is committed, while the backend has no room for workers
RTOL = 1e-3  # a changed worker count splits the batch's sums otherwise: equal to rounding, not bit for bit


def _params(model_dir: Path, **runconfig: Any) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    raw["train_input"]["batch_size"] = raw["eval_input"]["batch_size"] = 12  # splits 3 and 2 ways
    raw["runconfig"].update(
        {"max_steps": STEPS, "num_csx": 3, "model_dir": str(model_dir), "rpc_timeout_s": 30.0, **runconfig}
    )
    return raw


def _losses(model_dir: Path) -> dict[int, tuple[float, int]]:
    """(loss, workers) of every logged step."""
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["workers"]) for r in rows if "loss" in r}


class Elastic:
    """A run's events, and the test's hand on it: from the step event of ``KILL_AFTER`` on the backend has
    no room for workers and worker-1 is SIGKILLed; once the job has gone on with 2 workers and a try to
    start worker-1 again at a step boundary was refused too, there is room again; once worker-1 is started
    again, the runner waits at its next step event until worker-1 listens (``ElasticWorkers.wants_boundary``),
    so that it joins within a step or two however fast or slow this machine is."""

    def __init__(self, backend: NoRoomForWorkers) -> None:
        self.backend = backend
        self.runner: JobRunner | None = None
        self.events: list[JobEvent] = []
        self.refused_when_shrunk: int | None = None

    def on_event(self, e: JobEvent) -> None:
        self.events.append(e)
        backend = self.backend
        if isinstance(e, WorkersEvent) and e.to_workers == 2:
            self.refused_when_shrunk = backend.refused
        if not isinstance(e, StepEvent):
            return
        if e.record.step == KILL_AFTER:
            backend.refusing.set()
            os.kill(backend.procs[RoleSpec("worker", 1)].pid, signal.SIGKILL)
        elif self.refused_when_shrunk is not None and backend.refused > self.refused_when_shrunk:
            backend.refusing.clear()  # a try at a boundary was refused: now there is room
        if backend.started and e.record.workers == 2:
            assert self.runner is not None
            elastic = self.runner.elastic
            wait_until(lambda: elastic.wants_boundary, "worker-1, started again, to listen", 120)

    def workers(self) -> list[tuple[int, int, int]]:
        return [(e.step, e.from_workers, e.to_workers) for e in self.events if isinstance(e, WorkersEvent)]


def _fault_free(model_dir: Path) -> None:
    with job_log(model_dir, model_dir.name):
        JobRunner(load_params(_params(model_dir)), LocalProcessBackend(model_dir / "logs")).run()


@pytest.mark.slow  # ~30 s: a fault-free run and an elastic one, 40 steps of 3 workers each
def test_a_job_goes_on_with_fewer_workers_while_there_is_no_room_and_grows_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # retired workers are tried again at every step boundary: the test's step count stays small
    monkeypatch.setattr(elastic_module, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(elastic_module, "RETRY_MAX_S", 0.05)
    _fault_free(tmp_path / "fault_free")
    model_dir = tmp_path / "elastic"
    backend = NoRoomForWorkers(model_dir / "logs")
    run = Elastic(backend)
    raw = _params(model_dir, min_num_csx=2, elastic_wait_s=2.0)
    run.runner = JobRunner(load_params(raw), backend, run.on_event, job_id="elastic")
    with job_log(model_dir, "elastic"):
        summary = run.runner.run()

    assert summary.final_step == STEPS and summary.restarts == 1
    changes = run.workers()
    assert [(before, after) for _, before, after in changes] == [(3, 2), (2, 3)], changes
    (shrunk, _, _), (grown, _, _) = changes
    assert shrunk == KILL_AFTER + 1 and grown > shrunk
    assert run.refused_when_shrunk is not None and backend.refused > run.refused_when_shrunk  # tried again
    # the step records say how many workers made each step
    losses, fault_free = _losses(model_dir), _losses(tmp_path / "fault_free")
    assert [losses[s][1] for s in range(1, STEPS + 1)] == [3] * KILL_AFTER + [2] * (grown - shrunk) + [3] * (
        STEPS - grown + 1
    )
    # the same losses bit for bit while the worker count is the fault-free run's and nothing has differed
    # yet; from the first step with 2 workers on, equal to rounding, to the last
    assert all(losses[s] == fault_free[s] for s in range(1, KILL_AFTER + 1))
    differences = {s: abs(losses[s][0] / fault_free[s][0] - 1) for s in losses}
    assert max(differences.values()) < RTOL, differences
    # run.log says what happened, and when
    log = (model_dir / "run.log").read_text()
    assert "no capacity for worker-1 now: this test's backend has no room for workers now" in log
    assert f"workers 3 -> 2 from step {shrunk}: no capacity to start worker-1 again within 2s" in log
    assert f"workers 2 -> 3 from step {grown}: capacity returned: worker-1 started again" in log
    assert f"step {shrunk} loss" in log and "(2 of 3 workers)" in log


@pytest.mark.slow  # ~10 s
def test_without_min_num_csx_a_worker_without_room_fails_the_job_saying_why(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    backend = NoRoomForWorkers(model_dir / "logs")
    run = Elastic(backend)
    raw = _params(model_dir, elastic_wait_s=1.0)
    run.runner = JobRunner(load_params(raw), backend, run.on_event, job_id="m")
    with job_log(model_dir, "m"), pytest.raises(JobFailed) as failed:
        run.runner.run()
    message = str(failed.value)
    assert message.startswith(
        "no capacity to start worker-1 again within 1s (no capacity for worker-1 now: this test's backend "
        "has no room for workers now); going on without worker-1 would leave 2 workers, fewer than "
        "runconfig.min_num_csx (unset: num_csx=3; set it to go on with fewer)\nfaults of this run:\n"
    ), message
    assert "worker-1 (pid" in message and "killed by SIGKILL" in message
    assert run.workers() == [] and all(p.poll() is not None for p in backend.procs.values())

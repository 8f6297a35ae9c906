"""Elastic workers (training/elastic.py, and the slots of training/roles.py): which lost workers a job goes
on without, which processes then serve its worker slots, when it fails instead, and how retired workers are
tried again at step boundaries, without waiting, and join once they listen. A real ``RolePlane`` over a
backend that has room or not on demand, configuring nothing but recording what it would configure."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import weightstream.training.elastic as elastic_module
from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.backends.base import NoCapacityError, RoleSpec
from weightstream.params import Params, load_params, model_def
from weightstream.plan import make_plan
from weightstream.training.elastic import ElasticWorkers
from weightstream.training.errors import JobFailed
from weightstream.training.events import JobEvent, WorkersEvent
from weightstream.training.roles import RolePlane

W = [RoleSpec("worker", i) for i in range(3)]
# what the backend reports (Backend.wait_ready): every process but the retired ones
EVERYONE = {"memoryx": ["m0", "m1"], "swarmx": ["s0"], "activation": ["a0"], "worker": ["w0", "w1", "w2"]}
WITHOUT_1 = {**EVERYONE, "worker": ["w0", "w2"]}


class Backend:
    """Has no room for any role while ``full`` (or for its next ``full_for`` restarts); records every
    restart and retirement by role name."""

    co_located = True

    def __init__(self) -> None:
        self.full, self.full_for = True, 0
        self.restarts: list[list[str]] = []
        self.retired: list[str] = []

    def restart(self, roles: list[RoleSpec]) -> None:
        self.restarts.append([r.name for r in roles])
        if self.full or self.full_for:
            self.full_for = max(0, self.full_for - 1)
            raise NoCapacityError(roles, "the cluster is full")

    def retire(self, roles: list[RoleSpec]) -> None:
        self.retired += [r.name for r in roles]

    def dead(self) -> dict[RoleSpec, str]:
        return {}


class RecordingPlane(RolePlane):
    """The real role plane, but ``configure`` records (generation, resume_dir, keep_state, the workers'
    addresses by slot) instead of calling the roles."""

    configured: list[tuple[int, str | None, bool, list[str]]]

    def configure(
        self,
        addresses: dict[str, list[str]],
        resume_dir: str | None,
        keep_state: bool = False,
        later: frozenset[int] = frozenset(),
    ) -> None:
        self.addresses = addresses
        self.configured.append((self.generation, resume_dir, keep_state, self.serving()["worker"]))


def _params(**runconfig: Any) -> Params:
    raw = copy.deepcopy(TINY)
    raw["train_input"]["batch_size"] = raw["eval_input"]["batch_size"] = 12  # 3 and 2 ways
    raw["runconfig"].update({"num_csx": 3, "min_num_csx": 2, "elastic_wait_s": 0.2, **runconfig})
    return load_params(raw)


class Job:
    """One run's role plane and worker count, the events it emitted and the addresses it waits for."""

    def __init__(self, params: Params) -> None:
        self.params, self.backend, self.events = params, Backend(), list[JobEvent]()
        # a worker count asks its backend only to restart, retire and say who is dead
        backend: Any = self.backend
        self.roles = RecordingPlane(
            backend, make_plan(params), params.model_dump(mode="json"), "job", "t", 10.0
        )
        self.roles.configured = []
        self.roles.addresses = self.roles.placed(EVERYONE)
        self.listening = threading.Event()  # the workers started again listen
        self.listening.set()
        self.elastic = ElasticWorkers(
            self.roles,
            params,
            model_def(params),
            logging.getLogger("test"),
            self.events.append,
            threading.Event(),
            self.wait_ready,
        )

    def wait_ready(self) -> dict[str, list[str]]:
        assert self.listening.wait(10)
        return self.roles.placed(EVERYONE)

    def shrink(self) -> None:
        """Lose worker-1 at step 5 with no room for it, as recovery does: the job goes on with 2."""
        assert self.elastic.replace([W[1]], 4, JobFailed) == [W[1]]
        self.elastic.settle(self.roles.placed(WITHOUT_1))
        self.roles.addresses = self.roles.placed(WITHOUT_1)
        self.elastic.announce(5)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elastic_module, "RETRY_FIRST_S", 0.05)  # how soon is not what these tests check


@pytest.fixture
def job() -> Iterator[Job]:
    made = Job(_params())
    yield made
    made.roles.close()


def test_a_worker_without_room_is_left_out_and_its_slots_go_to_the_survivors(job: Job) -> None:
    job.shrink()
    assert len(job.backend.restarts) >= 2  # tried again while elastic_wait_s lasted
    assert job.backend.retired == ["worker-1"] and job.roles.retired == {1}
    # the backend reports 2 workers; by process index, worker-1 has none
    assert job.roles.addresses["worker"] == ["w0", "", "w2"]
    assert job.roles.plan == make_plan(job.params, num_csx=2) and job.roles.workers_at == (0, 2)
    assert job.roles.serving()["worker"] == ["w0", "w2"]  # slot 1 is served by process worker-2
    assert job.roles.serving_process("worker", 1) == W[2]
    assert W[1] not in job.roles.processes() and W[2] in job.roles.processes()
    assert job.events == [WorkersEvent(5, 3, 2, "no capacity to start worker-1 again within 0.2s")]
    job.elastic.announce(6)
    assert len(job.events) == 1  # announced once


def test_room_that_returns_within_the_wait_replaces_the_worker(job: Job) -> None:
    job.backend.full, job.backend.full_for = False, 2
    assert job.elastic.replace([W[1]], 4, JobFailed) == []
    assert job.backend.restarts == [["worker-1"]] * 3 and job.backend.retired == []
    job.elastic.settle(job.roles.placed(EVERYONE))
    job.elastic.announce(5)
    assert job.roles.workers_at == (0, 1, 2) and job.roles.plan.num_csx == 3 and job.events == []


@pytest.mark.parametrize(
    ("runconfig", "lost", "why"),
    [
        (
            {"min_num_csx": None},
            [W[1]],
            r"no capacity to start worker-1 again within 0s \(no capacity for worker-1 now: the cluster is "
            r"full\); going on without worker-1 would leave 2 workers, fewer than runconfig.min_num_csx "
            r"\(unset: num_csx=3; set it to go on with fewer\)",
        ),
        ({}, W[:2], r"would leave 1 workers, fewer than runconfig.min_num_csx=2$"),
        ({}, [RoleSpec("memoryx", 0)], r"the job can go on without workers only, not memoryx-0$"),
    ],
    ids=["min_num_csx unset", "below min_num_csx", "not a worker"],
)
def test_the_job_fails_rather_than_go_on_with_too_few_or_without_a_server(
    runconfig: dict[str, Any], lost: list[RoleSpec], why: str
) -> None:
    job = Job(_params(elastic_wait_s=0, **runconfig))
    try:
        with pytest.raises(JobFailed, match=why):
            job.elastic.replace(lost, 4, JobFailed)
        assert job.backend.retired == [] and job.roles.retired == frozenset()
    finally:
        job.roles.close()


def test_retired_workers_are_tried_at_boundaries_without_waiting_and_join_once_they_listen(job: Job) -> None:
    job.shrink()
    tries = len(job.backend.restarts)

    def boundary(sent_ahead: bool = False) -> float:
        """Seconds the boundary before step 10 took."""
        t0 = time.monotonic()
        job.elastic.at_boundary(9, sent_ahead)
        return time.monotonic() - t0

    wait_until(lambda: boundary() >= 0 and len(job.backend.restarts) > tries, "a try at a boundary", 5)
    assert job.backend.restarts[-1] == ["worker-1"] and job.roles.retired == {1}  # still no room
    tries = len(job.backend.restarts)
    boundary()
    assert len(job.backend.restarts) == tries  # not at once again: the next try waits its turn
    job.backend.full = False
    job.listening.clear()  # started, not listening yet
    wait_until(lambda: boundary() >= 0 and not job.roles.retired, "worker-1 started again", 5)
    assert boundary() < 1.0 and not job.elastic.wants_boundary  # the steps go on meanwhile
    assert job.roles.configured == [] and job.roles.plan.num_csx == 2
    job.listening.set()
    wait_until(lambda: job.elastic.wants_boundary, "worker-1 to listen", 5)
    boundary(sent_ahead=True)  # a step sent ahead: a new configuration would cancel it
    assert job.roles.configured == []
    boundary()
    generation = job.roles.generation
    assert job.roles.configured == [(generation, None, True, ["w0", "w1", "w2"])] and generation == 1
    assert job.roles.plan == make_plan(job.params) and job.roles.workers_at == (0, 1, 2)
    assert job.events[-1] == WorkersEvent(10, 2, 3, "capacity returned: worker-1 started again")

"""The job service's scheduler with fake runners: priority order, slots, cancel, failures, restart.

A fake runner blocks in ``run()`` until the test finishes it (or cancels or stops it), so every test
decides exactly when slots free up. The order jobs start in is the order the factory is called
(``_start`` runs under the scheduler's lock, one job after another).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fleet import FakeRunner, Fleet
from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.jobs.service import CapacityError, JobService, ServiceConfig
from weightstream.jobs.store import Job, JobStore
from weightstream.params import Params, load_params
from weightstream.training.events import EventSink
from weightstream.training.runner import JobFailed


class Harness:
    def __init__(self, data_dir: Path, slots: int, fleet: Fleet) -> None:
        self.fleet = fleet
        self.service = JobService(ServiceConfig(data_dir=data_dir, slots=slots), runner_factory=fleet)
        self.ids: dict[str, str] = {}

    def submit(self, name: str, num_csx: int = 1, priority: int = 2) -> Job:
        job = self.service.submit(copy.deepcopy(TINY), num_csx, {"name": name}, priority)
        self.ids[name] = job.id
        return job

    def job(self, name: str) -> Job:
        return self.service.store.get(self.ids[name])

    def status(self, name: str) -> str:
        return self.job(name).status

    def wait_status(self, name: str, status: str) -> None:
        wait_until(lambda: self.status(name) == status, lambda: f"{name} {status} (is {self.status(name)})")

    def wait_started(self, *names: str) -> None:
        wait_until(
            lambda: self.fleet.started[: len(names)] == list(names),
            lambda: f"started {list(names)} (started {self.fleet.started})",
        )


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(slots: int, fleet: Fleet | None = None) -> Harness:
        made.append(Harness(tmp_path, slots, fleet or Fleet()))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.service.shutdown()


def test_jobs_start_in_priority_order_fifo_within_a_priority(harness: Callable[..., Harness]) -> None:
    """With one slot, queued jobs run 1 before 2 before 3, and in submission order within a priority."""
    h = harness(slots=1)
    h.submit("blocker")
    h.wait_started("blocker")  # the slot is taken before the rest is queued: they all queue
    h.fleet.instant |= {"p3", "p2a", "p1a", "p2b", "p1b"}
    for name, prio in [("p3", 3), ("p2a", 2), ("p1a", 1), ("p2b", 2), ("p1b", 1)]:
        h.submit(name, priority=prio)
    h.fleet.runners["blocker"].finish()
    h.wait_started("blocker", "p1a", "p1b", "p2a", "p2b", "p3")
    h.wait_status("p3", "succeeded")


def test_the_head_of_the_queue_is_never_overtaken(harness: Callable[..., Harness]) -> None:
    """A job wanting 2 slots while 1 is free waits, and a 1-slot job behind it does not jump ahead."""
    h = harness(slots=2)
    h.submit("a")
    h.wait_started("a")
    passes = [0]
    queue = h.service.store.queue

    def counting_queue() -> list[Job]:
        passes[0] += 1
        return queue()

    h.service.store.queue = counting_queue  # type: ignore[method-assign]
    h.submit("big", num_csx=2)
    h.submit("small", num_csx=1)
    seen = passes[0]
    # two more passes: one that began after both were queued has finished deciding
    wait_until(lambda: passes[0] >= seen + 2, lambda: "two scheduler passes")
    assert h.fleet.started == ["a"]
    assert h.status("big") == h.status("small") == "queued"
    h.fleet.runners["a"].finish()
    h.wait_started("a", "big")
    assert h.status("small") == "queued"  # big holds both slots now
    h.fleet.runners["big"].finish()
    h.wait_started("a", "big", "small")


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled"])
def test_slots_are_released_when_a_job_ends(harness: Callable[..., Harness], outcome: str) -> None:
    """However the running job ends, its slot goes to the next job."""
    h = harness(slots=1)
    h.submit("first")
    h.wait_started("first")
    h.submit("next")
    runner = h.fleet.runners["first"]
    if outcome == "succeeded":
        runner.finish()
    elif outcome == "failed":
        runner.finish(JobFailed("role died"))
    else:
        h.service.cancel(h.ids["first"])
    h.wait_status("first", outcome)
    h.wait_started("first", "next")
    h.wait_status("next", "running")


def test_cancel_of_a_queued_job_is_immediate_and_it_never_starts(harness: Callable[..., Harness]) -> None:
    h = harness(slots=1)
    h.submit("running")
    h.wait_started("running")
    h.submit("doomed")
    assert h.service.cancel(h.ids["doomed"]).status == "cancelled"
    h.submit("after")  # behind "doomed" in the queue: if "doomed" were still queued it would go first
    h.fleet.runners["running"].finish()
    h.wait_started("running", "after")
    assert h.fleet.started == ["running", "after"]
    assert h.status("doomed") == "cancelled"


def test_cancel_of_a_running_job_cancels_its_runner(harness: Callable[..., Harness]) -> None:
    """The runner is told to cancel; the job is cancelled once its runner has wound down."""
    h = harness(slots=1)
    h.submit("job")
    h.wait_started("job")
    h.wait_status("job", "running")
    h.service.cancel(h.ids["job"])
    assert h.fleet.runners["job"].cancelled.is_set()
    h.wait_status("job", "cancelled")
    events = h.service.store.events(h.ids["job"], kinds=("status",))
    assert {"status": "cancelling"} in [e["data"] for e in events]


@pytest.mark.parametrize("error", [JobFailed("role died: worker-1 exited 3"), ValueError("bad shape")])
def test_a_runner_that_raises_fails_its_job_with_the_error(
    harness: Callable[..., Harness], error: Exception
) -> None:
    h = harness(slots=1)
    h.submit("job")
    h.wait_started("job")
    h.fleet.runners["job"].finish(error)
    h.wait_status("job", "failed")
    assert h.job("job").error == str(error)


def test_a_job_that_cannot_start_fails_and_the_next_one_runs(harness: Callable[..., Harness]) -> None:
    """The factory raising fails that job ("could not start") and frees its slot for the next."""
    fleet = Fleet()
    fleet.broken.add("broken")
    h = harness(slots=1, fleet=fleet)
    h.submit("broken", priority=1)
    h.submit("fine", priority=2)
    h.wait_status("broken", "failed")
    assert h.job("broken").error == "could not start: no backend for broken"
    h.wait_started("fine")
    h.wait_status("fine", "running")


def test_more_csx_than_slots_is_refused_at_submit(harness: Callable[..., Harness]) -> None:
    h = harness(slots=2)
    with pytest.raises(CapacityError, match="num_csx=4 exceeds"):
        h.submit("huge", num_csx=4)  # 4 divides the batch of 8: only the slots can refuse it
    assert h.service.store.list() == []


@pytest.mark.parametrize(("autoload", "status"), [(True, "queued"), (False, "failed")])
def test_a_job_running_at_a_restart_resumes_or_fails(
    harness: Callable[..., Harness], tmp_path: Path, autoload: bool, status: str
) -> None:
    """A job left ``running`` by a service that died is requeued (and runs again) if its params
    autoload the last checkpoint, else failed; never lost, never left running."""
    raw = copy.deepcopy(TINY)
    raw["runconfig"]["autoload_last_checkpoint"] = autoload
    store = JobStore(tmp_path / "jobs.sqlite")  # the state a crashed service leaves behind
    params = load_params(raw).model_dump(mode="json")
    store.create("crashed", params, 1, {"name": "crashed"}, 2, tmp_path / "jobs" / "crashed")
    store.transition("crashed", "running")
    store.close()

    h = harness(slots=1)
    h.ids["crashed"] = "crashed"
    assert [e["status"] for e in h.job("crashed").history][:3] == ["queued", "running", status]
    if autoload:
        h.wait_started("crashed")
        h.wait_status("crashed", "running")
    else:
        assert h.job("crashed").error == "interrupted by a service restart"
        h.submit("later")  # the scheduler is going: the failed job was not started before it
        h.wait_started("later")
        assert h.fleet.started == ["later"]


@pytest.mark.parametrize(
    ("autoload", "reason"),
    [(True, "resumes from its last checkpoint"), (False, "restarts from step 0")],
)
def test_shutdown_requeues_running_jobs_and_a_new_service_starts_them(
    tmp_path: Path, autoload: bool, reason: str
) -> None:
    """SIGTERM's path: the service stops the running job's roles and puts the job back in the queue
    (never failed), and the service started next on the same data dir runs it again."""
    fleet = Fleet()
    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=fleet)
    raw = copy.deepcopy(TINY)
    raw["runconfig"]["autoload_last_checkpoint"] = autoload
    job = service.submit(raw, 1, {"name": "job"})
    queued = service.submit(copy.deepcopy(TINY), 1, {"name": "queued"})
    wait_until(lambda: service.store.get(job.id).status == "running", lambda: "job running")
    service.shutdown(grace_s=10)
    assert fleet.runners["job"]._stopped, "its roles were not stopped"
    store = JobStore(tmp_path / "jobs.sqlite")
    record = store.get(job.id)
    store.close()
    assert record.status == "queued" and record.error is None
    assert [h["status"] for h in record.history] == ["queued", "running", "queued"]
    assert reason in record.history[-1]["reason"] and "service stopped" in record.history[-1]["reason"]

    again = Fleet()
    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=again)
    try:
        wait_until(lambda: again.started == ["job"], lambda: f"started {again.started}")
        assert service.store.get(queued.id).status == "queued"
    finally:
        service.shutdown(grace_s=10)


def test_shutdown_requeues_a_job_whose_runner_does_not_wind_down(tmp_path: Path) -> None:
    """A runner that ignores stop() (a backend that cannot reach its pods) must not leave its job
    ``running`` forever: after the grace period the service requeues it itself."""

    class Deaf(FakeRunner):
        def stop(self) -> None:  # hears nothing: run() goes on until its own 30 s timeout
            pass

    made: list[Deaf] = []

    def factory(job: Job, params: Params, on_event: EventSink) -> Deaf:
        made.append(Deaf(job))
        return made[-1]

    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=factory)
    job = service.submit(copy.deepcopy(TINY), 1)
    wait_until(lambda: service.store.get(job.id).status == "running", lambda: "job running")
    service.shutdown(grace_s=0.5)
    made[0].finish()  # let its thread end: it finds the store closed and only logs that
    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        assert store.get(job.id).status == "queued"
    finally:
        store.close()


def test_no_submission_is_accepted_once_the_service_stops(harness: Callable[..., Harness]) -> None:
    from weightstream.jobs.service import QueueFull

    h = harness(slots=1)
    h.service.shutdown(grace_s=5)
    with pytest.raises(QueueFull, match="stopping"):
        h.submit("late")


def test_a_cancel_whose_roles_fail_to_stop_still_cancels(harness: Callable[..., Harness]) -> None:
    """A backend stop racing its own start once raised "dictionary changed size during iteration" out
    of cancel (a 500). The runner is marked cancelled first, so the cancel stands and the job ends
    cancelled; the caller sees no error."""

    class Racy(FakeRunner):
        def cancel(self) -> None:
            super().cancel()
            raise RuntimeError("dictionary changed size during iteration")

    class RacyFleet(Fleet):
        def __call__(self, job: Job, params: Params, on_event: EventSink) -> FakeRunner:
            self.started.append(job.labels["name"])
            self.runners[job.labels["name"]] = runner = Racy(job)
            return runner

    h = harness(slots=1, fleet=RacyFleet())
    h.submit("job")
    h.wait_status("job", "running")
    h.service.cancel(h.ids["job"])
    h.wait_status("job", "cancelled")

"""The service's scheduler without HTTP: a job that cannot start fails; the queue keeps moving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.jobs.service import JobService, ServiceConfig


def test_a_job_that_cannot_start_fails_and_the_scheduler_goes_on(tmp_path: Path) -> None:
    service = JobService(ServiceConfig(tmp_path, slots=2))
    try:

        def broken_backend(*args: object, **kwargs: object) -> NoReturn:
            raise RuntimeError("no cluster credentials")

        service._backend = broken_backend  # type: ignore[method-assign]  # for this test only
        first = service.submit(dict(TINY), num_csx=1)
        second = service.submit(dict(TINY), num_csx=1)
        wait_until(lambda: all(service.is_terminal(j.id) for j in (first, second)), "both jobs to end", 10)
        for job in (first, second):
            record = service.store.get(job.id)
            assert record.status == "failed" and "no cluster credentials" in (record.error or "")
    finally:
        service.shutdown()


def test_last_event_is_the_newest_of_its_kind(tmp_path: Path) -> None:
    from weightstream.jobs.store import JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    job = store.create("j1", {}, 1, {}, 2, tmp_path / "j1")
    assert store.last_event(job.id, "step") is None
    for step in (1, 2, 3):
        store.add_event(job.id, "step", {"step": step})
        store.add_event(job.id, "eval", {"step": step})
    last = store.last_event(job.id, "step")
    assert last is not None and last["data"] == {"step": 3} and last["kind"] == "step"
    store.close()


def test_metrics_skip_the_line_a_job_is_still_writing(tmp_path: Path) -> None:
    """metrics.jsonl is appended to while a job runs: a reader can meet half a line (was a 500)."""
    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=lambda *a: None)  # type: ignore[arg-type]  # no runner: no job starts
    try:
        job = service.store.create("j1", {}, 1, {}, 2, tmp_path / "j1")
        (tmp_path / "j1").mkdir()
        (tmp_path / "j1" / "metrics.jsonl").write_text(
            '{"step": 1, "loss": 2.5}\n{"step": 1, "eval_loss": 2.4}\n{"step": 2, "lo'
        )
        assert service.metrics(job.id) == {
            "steps": [{"step": 1, "loss": 2.5}],
            "evals": [{"step": 1, "eval_loss": 2.4}],
        }
    finally:
        service.shutdown()


def test_a_runners_events_are_stored_as_the_apis_send_them(tmp_path: Path) -> None:
    """The runner's typed events leave the process here: each stored under its kind (its own phases as
    ``progress``, beside the backend's placement) with its ``data()`` as the event's data; a non-finite
    number (a diverged loss) as null."""
    from weightstream.jobs.store import Job
    from weightstream.params import Params
    from weightstream.training.events import EventSink, RestartEvent, StartingEvent, StepEvent
    from weightstream.training.records import StepRecord
    from weightstream.training.runner import RunSummary

    record = StepRecord(1, float("nan"), 0.0, 0.5, 16, 0.25, 0.0, 0.125, 0.0625, 1024, 2048)
    emitted = [
        StartingEvent(roles={"memoryx": 2, "worker": 1}),
        StepEvent(record, tokens_per_second=64.0, max_steps=4),
        RestartEvent("worker-0", "worker", 2, "worker-0 was killed", restarts=1, max_role_restarts=50),
    ]

    class Emitting:
        def __init__(self, job: Job, params: Params, on_event: EventSink) -> None:
            self.model_dir, self.on_event = Path(job.model_dir), on_event

        def run(self) -> RunSummary:
            for event in emitted:
                self.on_event(event)
            return RunSummary(1, 0, 1, None, None, None, 0.0)

        def cancel(self) -> None:
            pass

        def stop(self) -> None:
            pass

    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=Emitting)
    try:
        job = service.submit(dict(TINY), num_csx=1)
        wait_until(lambda: service.is_terminal(job.id), "the job to end", 10)
        assert service.store.get(job.id).status == "succeeded"
        stored = [(e["kind"], json.dumps(e["data"])) for e in service.store.events(job.id)]
    finally:
        service.shutdown()
    assert [s for s in stored if s[0] != "status"] == [
        ("progress", '{"status": "starting", "roles": {"memoryx": 2, "worker": 1}}'),
        (
            "step",
            '{"step": 1, "loss": null, "learning_rate": 0.0, "grad_norm": 0.5, "step_time_s": 0.25, '
            '"worker_wait_s": 0.0, "worker_compute_s": 0.125, "update_s": 0.0625, '
            '"worker_peak_rss_bytes": 1024, "worker_wire_bytes": 2048, "workers": 1, "slowest_worker": -1, '
            '"slowest_worker_ratio": 1.0, "slowest_worker_lag_s": 0.0, "tokens_per_second": 64.0, '
            '"max_steps": 4}',
        ),
        (
            "restart",
            '{"role": "worker-0", "role_kind": "worker", "step": 2, "reason": "worker-0 was killed", '
            '"restarts": 1, "max_role_restarts": 50, "fault": "died", "host": ""}',
        ),
    ]

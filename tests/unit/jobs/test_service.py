"""The service's scheduler without HTTP: a job that cannot start fails; the queue keeps moving."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.appliance import TINY
from weightstream.jobs.service import JobService, ServiceConfig


def test_a_job_that_cannot_start_fails_and_the_scheduler_goes_on(tmp_path: Path) -> None:
    service = JobService(ServiceConfig(tmp_path, slots=2))
    try:

        def broken_backend(*args: object) -> None:
            raise RuntimeError("no cluster credentials")

        service._backend = broken_backend  # type: ignore[method-assign]
        first = service.submit(dict(TINY), num_csx=1)
        second = service.submit(dict(TINY), num_csx=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(service.is_terminal(j.id) for j in (first, second)):
            time.sleep(0.05)
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
    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=lambda *a: None)  # type: ignore[arg-type,return-value]
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

"""The service's scheduler without HTTP: a job that cannot start fails; the queue keeps moving."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.appliance import TINY
from weightstream.coordinator.service import JobService, ServiceConfig


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

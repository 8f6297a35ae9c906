"""The job service's runners faked: ``Fleet`` is a runner factory whose runners block in ``run()`` until the
test finishes, cancels or stops them, so a test decides exactly when a job ends and its slots free up."""

from __future__ import annotations

import threading
from pathlib import Path

from weightstream.jobs.store import Job
from weightstream.params import Params
from weightstream.training.events import EventSink
from weightstream.training.runner import JobCancelled, JobFailed, RunSummary


class FakeRunner:
    """Blocks in ``run()`` until finished, cancelled or stopped; then succeeds, fails or is cancelled."""

    def __init__(self, job: Job) -> None:
        self.model_dir = Path(job.model_dir)
        self.cancelled = threading.Event()
        self._go = threading.Event()
        self._error: BaseException | None = None
        self._stopped = False

    def finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._go.set()

    def run(self) -> RunSummary:
        if not self._go.wait(timeout=30):  # a forgotten runner must not hang the suite
            raise JobFailed("fake runner was never finished")
        if self.cancelled.is_set():
            raise JobCancelled("cancelled")
        if self._stopped:  # as JobRunner: its roles are stopped, so run fails
            raise JobFailed("stopped: the service is shutting down")
        if self._error is not None:
            raise self._error
        return RunSummary(1, 0, 1, 0.5, None, None, 0.0)

    def cancel(self) -> None:
        self.cancelled.set()
        self._go.set()

    def stop(self) -> None:
        self._stopped = True
        self._go.set()


class Fleet:
    """The runner factory. Jobs are told apart by their ``name`` label; ``instant`` ones succeed at once,
    ``broken`` ones make the factory raise."""

    def __init__(self) -> None:
        self.started: list[str] = []  # names, in the order the scheduler started them
        self.runners: dict[str, FakeRunner] = {}
        self.instant: set[str] = set()
        self.broken: set[str] = set()

    def __call__(self, job: Job, params: Params, on_event: EventSink) -> FakeRunner:
        name = job.labels["name"]
        if name in self.broken:
            raise RuntimeError(f"no backend for {name}")
        self.started.append(name)
        self.runners[name] = runner = FakeRunner(job)
        if name in self.instant:
            runner.finish()
        return runner

"""The coordinator as a long-lived service: a persistent queue of jobs run on a fixed number of CS-2 slots.

No HTTP here (``api/`` and ``grpc_api`` translate); this is the behaviour: admit and enqueue, run jobs
in priority order when enough slots are free, cancel, recover after a restart, and answer what a job did.
``submit`` is the one admission path of both APIs: whatever their own schemas let through, the request,
the params, every bound (``limits``), the data roots (``data_roots``) and the slots are checked there by
``admission``, the pipeline ``weightstream validate`` and ``run`` share; label and priority changes are
checked here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from weightstream.backends.base import Backend
from weightstream.checkpoint_layout import complete_checkpoints, servable_file
from weightstream.jobs.admission import Admission, CapacityError, Submission, admit
from weightstream.jobs.config import ServiceConfig, default_user_name
from weightstream.jobs.data_roots import default_data_root
from weightstream.jobs.limits import ServiceLimits, apply_label_change, check_priority
from weightstream.jobs.log_export import job_log_archive
from weightstream.jobs.role_backends import end_leftovers, make_backend
from weightstream.jobs.store import TERMINAL, IllegalTransition, Job, JobStore
from weightstream.params import Params, ParamsError, load_params
from weightstream.training.events import EventSink, JobEvent, StatusEvent
from weightstream.training.runner import JobCancelled, JobFailed, JobRunner, RunSummary, job_log

__all__ = [
    "CapacityError",
    "JobService",
    "QueueFull",
    "Runner",
    "RunnerFactory",
    "ServiceConfig",
    "ServiceLimits",
    "default_user_name",
]

log = logging.getLogger("weightstream.service")
# How long shutdown waits for stopped jobs to wind down before it requeues them itself: inside the 30 s a
# Kubernetes pod gets between SIGTERM and SIGKILL, with room for the REST and gRPC servers to stop too.
SHUTDOWN_GRACE_S = 20.0


class QueueFull(RuntimeError):
    """The service already holds as many queued jobs as it may: try again later (REST 429, gRPC
    RESOURCE_EXHAUSTED)."""


class Runner(Protocol):
    """What the service needs of a job's runner (``training.runner.JobRunner``; tests pass fakes)."""

    model_dir: Path

    def run(self) -> RunSummary: ...

    def cancel(self) -> None: ...

    def stop(self) -> None: ...


RunnerFactory = Callable[[Job, Params, EventSink], Runner]


class JobService:
    def __init__(self, config: ServiceConfig, runner_factory: RunnerFactory | None = None) -> None:
        """``runner_factory(job, params, on_event)`` makes the runner of a job that starts; by default a
        ``JobRunner`` on the configured backend."""
        self.config = config
        self.jobs_dir = config.data_dir / "jobs"
        for d in (config.data_dir, self.jobs_dir):  # other users of the machine see none of it
            d.mkdir(mode=0o750, parents=True, exist_ok=True)
        default = Path(os.path.realpath(default_data_root(config.data_dir)))
        if default in config.data_roots:
            default.mkdir(mode=0o750, exist_ok=True)
        for root in config.data_roots:
            if not root.is_dir():
                raise ValueError(f"data root {root} is not a directory")
        db = config.data_dir / "jobs.sqlite"
        os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))  # SQLite gives its WAL files the db's mode
        self.store = JobStore(db)
        self._make_runner = runner_factory or self._job_runner
        self._running: dict[str, tuple[Runner, int]] = {}  # job id -> (its runner, the CS-2 slots it holds)
        self._threads: dict[str, threading.Thread] = {}
        self._stopping: set[str] = set()  # jobs stopped by shutdown: requeued, not failed
        self._lock = threading.Lock()
        self._submit_lock = threading.Lock()  # counting the queue and adding to it are one step
        self._labels_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()  # set first thing by stop(): no more submissions or starts
        self._stop_lock = threading.Lock()
        self._stopped_jobs = False  # stop() has stopped and requeued the running jobs
        self._recover()
        self._scheduler = threading.Thread(target=self._schedule, name="scheduler", daemon=True)
        self._scheduler.start()

    # -- accepting work ------------------------------------------------------------------------------------
    def submit(
        self, params: dict[str, Any], num_csx: int | None = None, labels: dict[str, str] | None = None,
        priority: int = 2,
    ) -> Job:  # fmt: skip
        """Admit the job (``admission``: its request, its params, then the service's limits, data roots
        and slots), then enqueue it. ``num_csx`` overrides ``runconfig.num_csx`` (None: the params' own).
        Raises ParamsError (each problem at its key path), CapacityError (over the CS-2 slots) or
        QueueFull (full, or stopping)."""
        limits = self.config.limits
        labels = {} if labels is None else labels
        job_id = uuid.uuid4().hex[:12]
        model_dir = self.jobs_dir / job_id
        submission = Submission(params, num_csx, labels, priority)
        parsed = admit(Admission.submitted(submission, self.config, {"model_dir": str(model_dir)})).params
        num_csx = parsed.runconfig.num_csx
        with self._submit_lock:
            if self._stopped.is_set():
                raise QueueFull("the service is stopping: submit again once it is back")
            if len(self.store.queue()) >= limits.max_queued_jobs:
                raise QueueFull(
                    f"the queue holds {limits.max_queued_jobs} jobs, as many as this service accepts "
                    "(serve --max-queued-jobs): submit again once some have started"
                )
            job = self.store.create(
                job_id,
                parsed.model_dump(mode="json"),
                num_csx,
                dict(labels),
                priority,
                model_dir,
                self.config.user_name,
            )
        self._wake.set()
        return job

    def set_labels(self, job_id: str, set_: Mapping[str, str], remove: Sequence[str] = ()) -> Job:
        """Set the labels ``set_`` and remove the keys ``remove`` (one it lacks is no error) on a job of any
        status, within the limits of a submission. Raises UnknownJob, or ParamsError naming each problem."""
        with self._labels_lock:  # read, merge and write as one step: two changes at once both count
            merged, problems = apply_label_change(self.store.get(job_id).labels, set_, remove)
            if problems:
                raise ParamsError(problems, "label change")
            return self.store.set_labels(job_id, merged)

    def set_priority(self, job_id: str, priority: int) -> Job:
        """Change the priority of a queued or running job: a queued one takes its new place in the queue
        at once. Raises UnknownJob, ParamsError (not 1, 2 or 3) or JobFinished."""
        problems = check_priority(priority)
        if problems:
            raise ParamsError(problems, "priority")
        job = self.store.set_priority(job_id, priority)
        self._wake.set()  # it may now head the queue, and fit in the slots that are free
        return job

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once, or stop a running one (its processes are stopped now; the job
        is marked cancelled when its runner has wound down). Finished jobs raise IllegalTransition."""
        with self._lock:  # the scheduler starts jobs under this lock: a queued job stays queued meanwhile
            job = self.store.get(job_id)
            runner, _ = self._running.get(job_id, (None, 0))
            if job.status == "queued":
                return self.store.transition(job_id, "cancelled", reason="cancelled by request")
        if job.status == "running" and runner is not None:
            self.store.add_event(job_id, "status", {"status": "cancelling"})
            # A runner is marked cancelled before it stops its roles; if stopping them raises (a backend
            # racing its own start), its run() stops them again as it winds down: the cancel stands.
            try:
                runner.cancel()
            except Exception:
                log.exception("job %s: stopping its roles for a cancel failed", job_id)
            return self.store.get(job_id)
        raise IllegalTransition(job_id, job.status, "cancelled")

    # -- running -------------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """After a restart, jobs that were running are resumed (autoload) or failed, never lost; what the
        backend still held of them is ended first (``role_backends.end_leftovers``)."""
        for job in self.store.list(status="running"):
            for left in end_leftovers(self.config, job.id):
                log.info("job %s: ended %s, left by the service's previous run", job.id, left)
            if job.params["runconfig"].get("autoload_last_checkpoint", True):
                self.store.transition(
                    job.id, "queued", reason="service restarted; resumes from its last checkpoint"
                )
            else:
                self.store.transition(
                    job.id,
                    "failed",
                    reason="service restarted while the job was running",
                    error="interrupted by a service restart",
                )

    def _schedule(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                if self._stopped.is_set():  # shutdown may have set it while this pass waited for the lock
                    return
                free = self.config.slots - sum(n for _, n in self._running.values())
                for job in self.store.queue():  # strict order: the head of the queue is never overtaken
                    if job.num_csx > free:
                        break
                    try:
                        self._start(job)
                    except Exception as e:  # a job that cannot start fails; the scheduler goes on
                        log.exception("job %s could not start", job.id)
                        self._running.pop(job.id, None)
                        self.store.transition(job.id, "failed", error=f"could not start: {e}")
                        continue
                    free -= job.num_csx
            self._wake.wait(0.5)
            self._wake.clear()

    def _start(self, job: Job) -> None:
        self.store.transition(job.id, "running")
        Path(job.model_dir).mkdir(mode=0o750, parents=True, exist_ok=True)
        params = load_params(job.params)
        runner = self._make_runner(job, params, functools.partial(self._on_event, job.id))
        self._running[job.id] = (runner, job.num_csx)
        thread = threading.Thread(target=self._run, args=(job.id, runner), name=f"job-{job.id}", daemon=True)
        self._threads[job.id] = thread
        thread.start()

    def _job_runner(self, job: Job, params: Params, on_event: EventSink) -> Runner:
        backend = self._backend(job, params)
        limit = self.config.limits.max_job_seconds
        used = job.running_seconds()  # over its earlier runs: a restart requeues a job
        return JobRunner(params, backend, on_event, job.id, time_limit_s=limit, time_used_s=used)

    def _backend(self, job: Job, params: Params) -> Backend:
        def placement(msg: str) -> None:
            self.store.add_event(job.id, "progress", {"placement": msg})

        return make_backend(
            self.config, job.id, params, Path(job.model_dir) / "logs", job.priority, placement
        )

    def _run(self, job_id: str, runner: Runner) -> None:
        try:
            with job_log(runner.model_dir, job_id) as job_logger:
                try:
                    summary = runner.run()
                    self.store.transition(job_id, "succeeded", reason=f"done: step {summary.final_step}")
                except JobCancelled as e:
                    job_logger.info("cancelled: %s", e)
                    self.store.transition(job_id, "cancelled", reason=str(e))
                except (JobFailed, Exception) as e:
                    if job_id in self._stopping:  # the service is stopping: the job runs again after it
                        job_logger.info("stopped with the service: %s", e)
                        self._requeue(job_id)
                    else:
                        job_logger.exception("job failed")
                        self.store.transition(job_id, "failed", error=str(e))
        except Exception:  # recording the end failed (a shutdown closed the store first): nothing to tell
            log.exception("job %s: could not record how it ended", job_id)
        finally:
            with self._lock:
                self._running.pop(job_id, None)
                self._threads.pop(job_id, None)
            self._wake.set()

    def _requeue(self, job_id: str) -> None:
        """A running job back to the queue as the service stops; it resumes when the service is back."""
        job = self.store.get(job_id)
        if job.params["runconfig"].get("autoload_last_checkpoint", True):
            reason = "service stopped; resumes from its last checkpoint"
        else:
            reason = "service stopped; restarts from step 0 (its params disable autoload_last_checkpoint)"
        self.store.transition(job_id, "queued", reason=reason)

    def _on_event(self, job_id: str, event: JobEvent) -> None:
        # the runner's own phases (starting roles, running) are kept as progress, beside the backend's
        kind = "progress" if isinstance(event, StatusEvent) else event.kind
        self.store.add_event(job_id, kind, event.data())

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting and scheduling, stop every running job's roles and put those jobs back in the
        queue, so that the service, once restarted on the same data dir, resumes them (autoload). The
        store stays open (the APIs may still answer while they drain). Safe to call from any thread, more
        than once: later calls wait for the first."""
        with self._stop_lock:
            if not self._stopped_jobs:
                self._stop_jobs(grace_s)
                self._stopped_jobs = True

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """``stop``, then close the job store: the last call on a service."""
        self.stop(grace_s)
        self.store.close()

    def _stop_jobs(self, grace_s: float) -> None:
        with self._submit_lock:  # a submission under way is stored first: then it is queued, not lost
            self._stopped.set()
        self._wake.set()
        self._scheduler.join(timeout=grace_s)  # a pass under way finishes starting its jobs first
        with self._lock:
            running = dict(self._running)
            self._stopping.update(running)
            threads = list(self._threads.values())
        for job_id, (runner, _) in running.items():
            try:
                runner.stop()
            except Exception:  # its thread still ends the job; below it is requeued all the same
                log.exception("job %s: stopping its roles failed", job_id)
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            stuck = list(self._running)
        # a runner that did not wind down in time: its job is requeued here, it must not stay running
        for job_id in stuck:
            with contextlib.suppress(IllegalTransition):  # its thread recorded the end meanwhile
                self._requeue(job_id)

    # -- answers -------------------------------------------------------------------------------------------
    def metrics(self, job_id: str) -> dict[str, list[dict[str, Any]]]:
        path = Path(self.store.get(job_id).model_dir) / "metrics.jsonl"
        rows = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # the last line, while the job is still writing it
                continue
        return {"steps": [r for r in rows if "loss" in r], "evals": [r for r in rows if "eval_loss" in r]}

    def logs(self, job_id: str, tail: int | None = None) -> str:
        path = Path(self.store.get(job_id).model_dir) / "run.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:] if tail else lines) + ("\n" if lines else "")

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """Every complete checkpoint of the job with a file to serve: its step and its servable files
        (``checkpoint_layout.servable_file``: plain files, no links) with their sizes."""
        model_dir, out = Path(self.store.get(job_id).model_dir), []
        for step, d in complete_checkpoints(model_dir):
            try:
                names = sorted(f.name for f in d.iterdir())
            except FileNotFoundError:  # removed meanwhile by the job's checkpoint retention
                continue
            real = {n: servable_file(model_dir, step, n) for n in names}
            files = [{"name": n, "size": r.stat().st_size} for n, r in real.items() if r is not None]
            if files:  # a checkpoint with nothing to serve (a link elsewhere) is not listed
                out.append({"step": step, "files": files})
        return out

    def open_checkpoint_file(self, job_id: str, step: int, name: str) -> BinaryIO:
        """One servable file of a complete checkpoint, opened (without following a link planted since the
        check): once open it reads whole even if retention deletes it meanwhile. KeyError if none."""
        real = servable_file(Path(self.store.get(job_id).model_dir), step, name)
        try:
            if real is None:
                raise FileNotFoundError(name)
            return os.fdopen(os.open(real, os.O_RDONLY | os.O_NOFOLLOW), "rb")
        except OSError as e:  # not servable, gone since the check (retention), or replaced by a link
            raise KeyError(f"job {job_id} has no checkpoint file {name!r} at step {step}") from e

    def export_logs(self, job_id: str) -> Iterator[bytes]:
        """The job's logs as a tar.gz, in chunks (``log_export``: plain files of its own directory only,
        bounded). FileNotFoundError if the job has not started yet: it has no directory, hence no logs."""
        model_dir = Path(self.store.get(job_id).model_dir)
        if not model_dir.is_dir() or model_dir.is_symlink():
            raise FileNotFoundError(f"job {job_id} has no logs yet: it has not started")
        return job_log_archive(job_id, model_dir)

    def is_terminal(self, job_id: str) -> bool:
        return self.store.get(job_id).status in TERMINAL

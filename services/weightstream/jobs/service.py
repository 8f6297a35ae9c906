"""The coordinator as a long-lived service: a persistent queue of jobs run on a fixed number of CS-2 slots.

No HTTP here (``api/`` and ``grpc_api`` translate); this is the behaviour: validate and enqueue, run jobs
in priority order when enough slots are free, cancel, recover after a restart, and answer what a job did.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from weightstream.backends.base import Backend
from weightstream.backends.kubernetes import INSTALL_HINT, client_available
from weightstream.backends.kubernetes.manifests import ClusterConfig
from weightstream.backends.local import LocalProcessBackend
from weightstream.checkpoint_layout import checkpoint_dir, complete_checkpoints
from weightstream.data import DataError, make_data_processor
from weightstream.jobs.store import TERMINAL, IllegalTransition, Job, JobStore
from weightstream.params import Params, ParamsError, Problem, load_params
from weightstream.training.runner import JobCancelled, JobFailed, JobRunner, RunSummary, job_log

__all__ = ["CapacityError", "JobService", "Runner", "RunnerFactory", "ServiceConfig"]

log = logging.getLogger("weightstream.service")


class CapacityError(ValueError):
    """A job asks for more CS-2 than the service has: it could never run."""


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path
    slots: int  # CS-2 the service may run at once, over all jobs
    backend: str = "local"  # local: processes on this machine; kubernetes: pods in cluster.namespace
    cluster: ClusterConfig | None = None


class Runner(Protocol):
    """What the service needs of a job's runner (``training.runner.JobRunner``; tests pass fakes)."""

    model_dir: Path

    def run(self) -> RunSummary: ...

    def cancel(self) -> None: ...

    def stop(self) -> None: ...


EventSink = Callable[[dict[str, Any]], None]
RunnerFactory = Callable[[Job, Params, EventSink], Runner]


class JobService:
    def __init__(self, config: ServiceConfig, runner_factory: RunnerFactory | None = None) -> None:
        """``runner_factory(job, params, on_event)`` makes the runner of a job that starts; by default a
        ``JobRunner`` on the configured backend."""
        self.config = config
        self.jobs_dir = config.data_dir / "jobs"
        self.store = JobStore(config.data_dir / "jobs.sqlite")
        self._make_runner = runner_factory or self._job_runner
        self._running: dict[str, tuple[Runner, int]] = {}  # job id -> (its runner, the CS-2 slots it holds)
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._recover()
        self._scheduler = threading.Thread(target=self._schedule, name="scheduler", daemon=True)
        self._scheduler.start()

    # -- accepting work ------------------------------------------------------------------------------------
    def submit(
        self, params: dict[str, Any], num_csx: int, labels: dict[str, str] | None = None, priority: int = 2
    ) -> Job:
        """Validate exactly as `weightstream run` does, then enqueue. Raises ParamsError or CapacityError."""
        if num_csx > self.config.slots:
            raise CapacityError(f"num_csx={num_csx} exceeds this service's {self.config.slots} CS-2 slots")
        job_id = uuid.uuid4().hex[:12]
        model_dir = self.jobs_dir / job_id
        parsed = load_params(
            params, overrides={"num_csx": num_csx, "model_dir": str(model_dir)}, source="params"
        )
        try:  # the data must be readable here too, before the job is accepted
            make_data_processor(parsed.train_input, parsed.model, "train")
            if parsed.eval_input:
                make_data_processor(parsed.eval_input, parsed.model, "eval")
        except DataError as e:
            raise ParamsError([Problem("train_input.data_dir", str(e))]) from e
        job = self.store.create(
            job_id, parsed.model_dump(mode="json"), num_csx, labels or {}, priority, model_dir
        )
        self._wake.set()
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
            runner.cancel()
            return self.store.get(job_id)
        raise IllegalTransition(job_id, job.status, "cancelled")

    # -- running -------------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """After a restart, jobs that were running are resumed (autoload) or failed, never lost."""
        for job in self.store.list(status="running"):
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
        params = load_params(job.params)
        runner = self._make_runner(job, params, lambda e, j=job.id: self._on_event(j, e))
        self._running[job.id] = (runner, job.num_csx)
        thread = threading.Thread(target=self._run, args=(job.id, runner), name=f"job-{job.id}", daemon=True)
        self._threads[job.id] = thread
        thread.start()

    def _job_runner(self, job: Job, params: Params, on_event: EventSink) -> Runner:
        backend = self._backend(job.id, params, Path(job.model_dir) / "logs")
        return JobRunner(params, backend, on_event=on_event, job_id=job.id)

    def _backend(self, job_id: str, params: Params, run_dir: Path) -> Backend:
        if self.config.backend == "kubernetes":
            if not client_available():
                raise RuntimeError(f"the Kubernetes backend needs the Kubernetes client: {INSTALL_HINT}")
            # imported only here: the kubernetes package is an optional extra
            from weightstream.backends.kubernetes.backend import KubernetesBackend

            def placement(msg: str) -> None:
                self.store.add_event(job_id, "progress", {"placement": msg})

            return KubernetesBackend(
                job_id, params, self.config.cluster or ClusterConfig(), on_progress=placement
            )
        return LocalProcessBackend(run_dir)

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
                    job_logger.exception("job failed")
                    self.store.transition(job_id, "failed", error=str(e))
        finally:
            with self._lock:
                self._running.pop(job_id, None)
            self._wake.set()

    def _on_event(self, job_id: str, event: dict[str, Any]) -> None:
        kind = event.pop("event")
        if kind == "status":  # the runner's own phases (starting roles, running): kept as progress
            self.store.add_event(job_id, "progress", event)
        else:
            self.store.add_event(job_id, kind, event)

    def shutdown(self) -> None:
        """Stop scheduling and stop every running job's processes (their jobs stay resumable)."""
        self._stopped.set()
        self._wake.set()
        with self._lock:
            runners = [r for r, _ in self._running.values()]
        for r in runners:
            r.stop()
        for t in list(self._threads.values()):
            t.join(timeout=10)
        self.store.close()

    # -- answers -------------------------------------------------------------------------------------------
    def metrics(self, job_id: str) -> dict[str, list[dict[str, Any]]]:
        path = Path(self.store.get(job_id).model_dir) / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return {"steps": [r for r in rows if "loss" in r], "evals": [r for r in rows if "eval_loss" in r]}

    def logs(self, job_id: str, tail: int | None = None) -> str:
        path = Path(self.store.get(job_id).model_dir) / "run.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:] if tail else lines) + ("\n" if lines else "")

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """Every complete checkpoint of the job: its step and its files with their sizes."""
        out = []
        for step, d in complete_checkpoints(Path(self.store.get(job_id).model_dir)):
            files = [{"name": f.name, "size": f.stat().st_size} for f in sorted(d.iterdir()) if f.is_file()]
            out.append({"step": step, "files": files})
        return out

    def checkpoint_file(self, job_id: str, step: int, name: str) -> Path:
        """Path of one file of a complete checkpoint; KeyError if there is no such file."""
        for c in self.checkpoints(job_id):
            if c["step"] == step and any(f["name"] == name for f in c["files"]):
                return checkpoint_dir(Path(self.store.get(job_id).model_dir), step) / name
        raise KeyError(f"job {job_id} has no checkpoint file {name!r} at step {step}")

    def is_terminal(self, job_id: str) -> bool:
        return self.store.get(job_id).status in TERMINAL

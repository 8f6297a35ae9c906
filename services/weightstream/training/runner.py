"""Run one job: plan it, start its roles through a backend, drive the steps, evaluate, checkpoint.

Step s, as the coordinator drives it (every call has a deadline; a dead role fails the job at once):
  1. RunStep(s) on every worker (they pull weights through SwarmX and push gradients back)
  2. GradNormSq(s) on every MemoryX shard (each waits until its gradients are complete)
  3. ApplyUpdate(s, lr, clip coefficient) on every shard: the step is applied exactly once
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from weightstream.backends.base import Backend, BackendError, RoleSpec
from weightstream.checkpoint_layout import last_checkpoint, shard_file_name
from weightstream.numerics.optim import clip_coefficient
from weightstream.params import Params, dump_params, model_def, optimizer_config
from weightstream.plan import ROLE_KINDS, JobSpec, make_plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.storage_io import write_text_durably
from weightstream.training.cadence import Cadence
from weightstream.training.checkpoints import finish_checkpoint, partial_dir, prune_checkpoints
from weightstream.training.divergence import check_finite
from weightstream.training.errors import JobCancelled, JobFailed
from weightstream.transport.auth import new_role_token
from weightstream.transport.rpc import call, open_channel

__all__ = ["JobCancelled", "JobFailed", "JobRunner", "RunSummary", "job_log"]

log = logging.getLogger("weightstream.training")
T = TypeVar("T")
Event = dict[str, Any]


@contextmanager
def job_log(model_dir: Path, job_id: str) -> Iterator[logging.Logger]:
    """Send job ``job_id``'s coordinator log to ``model_dir/run.log`` while the block runs."""
    model_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(model_dir / "run.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = log.getChild(job_id)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()


@dataclass(frozen=True)
class RunSummary:
    steps_run: int
    start_step: int
    final_step: int
    last_loss: float | None
    last_eval_loss: float | None
    checkpoint: Path | None
    wall_s: float


class JobRunner:
    def __init__(
        self,
        params: Params,
        backend: Backend,
        on_event: Callable[[Event], None] | None = None,
        job_id: str = "local",
        time_limit_s: float | None = None,
        time_used_s: float = 0.0,
    ) -> None:
        """``time_limit_s``: the job's wall-clock limit (None: none), of which earlier runs of it (before a
        service restart) used ``time_used_s``; checked before every step."""
        self.params, self.backend, self.job_id = params, backend, job_id
        self.time_limit_s, self.time_used_s = time_limit_s, time_used_s
        self.on_event = on_event or (lambda e: None)
        self.rc = params.runconfig
        self.model = model_def(params)
        self.opt = optimizer_config(params.optimizer)
        self.plan = make_plan(params, self.model)
        self.model_dir = Path(self.rc.model_dir)
        self._pool = ThreadPoolExecutor(
            max(8, 2 * self.rc.num_csx + self.rc.num_wgt_servers), thread_name_prefix="coord"
        )
        self._cancelled = threading.Event()
        self.log = log.getChild(job_id)  # one logger per job: a service runs several at once

    def cancel(self) -> None:
        """Stop the job from another thread: its roles are stopped at once, ``run`` raises JobCancelled."""
        self._cancelled.set()
        self.backend.stop()

    def stop(self) -> None:
        """Stop the job's roles from another thread (the service is shutting down); ``run`` fails, and
        the checkpoints written so far stay for a resume."""
        self.backend.stop()

    # -- plumbing ------------------------------------------------------------------------------------------
    def _emit(self, kind: str, **data: Any) -> None:
        self.on_event({"event": kind, **data})

    def _all(self, kind: str, fn: Callable[[int], T], timeout_s: float) -> list[T]:
        """Run ``fn(i)`` for every role of ``kind`` concurrently; fail fast if any role dies meanwhile."""
        futures: list[Future[T]] = [self._pool.submit(fn, i) for i in range(self.plan.counts()[kind])]
        deadline = time.monotonic() + timeout_s
        pending: set[Future[T]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    self._check_roles(grace_s=1.0)  # a dead role explains a failed call better than the call
                    raise JobFailed(str(f.exception())) from f.exception()
            self._check_roles()
            if time.monotonic() > deadline:
                raise JobFailed(f"{kind}s did not answer within {timeout_s:.0f}s")
        return [f.result() for f in futures]

    def _check_roles(self, grace_s: float = 0.0) -> None:
        """Fail the job if a role has died. ``grace_s``: after a failed call, the peer's exit may reach
        us a moment after its closed connection does, so look again for that long."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = self.backend.failures()
            if dead:
                raise JobFailed("role died: " + "; ".join(dead))
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    # -- the job -------------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        t0 = time.monotonic()
        self.model_dir.mkdir(parents=True, exist_ok=True)
        write_text_durably(self.model_dir / "params.yaml", dump_params(self.params))
        resume = last_checkpoint(self.model_dir) if self.rc.autoload_last_checkpoint else None
        start_step = resume[0] if resume else 0
        if resume:
            self.log.info("resuming from %s", resume[1])
            self._emit("status", status="resuming", checkpoint=str(resume[1]), step=start_step)
        roles = [RoleSpec(kind, i) for kind, i in self.plan.roles()]
        self._emit("status", status="starting", roles=self.plan.counts())
        # a new role credential for every start: roles of an earlier run of this job cannot join this one
        self.credential = new_role_token()
        try:
            if self._cancelled.is_set():
                raise JobCancelled("cancelled before it started")
            self.backend.start(roles, self.credential)
            try:
                self.addresses = self.backend.wait_ready(timeout_s=min(120.0, self.rc.rpc_timeout_s))
            except BackendError as e:
                if self._cancelled.is_set():
                    raise JobCancelled("cancelled while starting") from e
                raise JobFailed(str(e)) from e
            self._configure(str(resume[1]) if resume else None)
            return self._train(start_step, t0)
        except JobFailed as e:
            if self._cancelled.is_set():
                raise JobCancelled("cancelled") from e
            raise
        finally:
            self.backend.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _configure(self, resume_dir: str | None) -> None:
        params = self.params.model_dump(mode="json")
        for kind in ROLE_KINDS:  # MemoryX and activation first: SwarmX and workers only connect lazily anyway
            controls = [rpc.ControlStub(open_channel(a, self.credential)) for a in self.addresses[kind]]

            def configure(i: int, kind: str = kind, controls: list[Any] = controls) -> None:
                job = JobSpec(params, self.plan.to_dict(), self.addresses, kind, i, resume_dir, self.job_id)
                call(
                    f"{kind}-{i}",
                    "Configure",
                    controls[i].Configure,
                    pb.ConfigureRequest(job_json=job.to_json()),
                    timeout=self.rc.rpc_timeout_s,
                )

            self._all(kind, configure, self.rc.rpc_timeout_s)
        self.workers = [rpc.WorkerStub(open_channel(a, self.credential)) for a in self.addresses["worker"]]
        self.shards = [rpc.MemoryXStub(open_channel(a, self.credential)) for a in self.addresses["memoryx"]]
        self._emit("status", status="running", addresses=self.addresses)

    def _rpc_all(self, kind: str, method: str, request: Any) -> list[Any]:
        """Call ``method`` on every worker or MemoryX shard at once (``request`` may be a function of the
        index), each call with the job's deadline."""
        stubs = self.workers if kind == "worker" else self.shards
        timeout = self.rc.rpc_timeout_s

        def one(i: int) -> Any:
            req = request(i) if callable(request) else request
            return call(f"{kind}-{i}", method, getattr(stubs[i], method), req, timeout=timeout)

        return self._all(kind, one, timeout)

    def _step(self, step: int) -> dict[str, Any]:
        """Train step ``step`` (0-based); returns its metrics record."""
        t0 = time.monotonic()
        replies = self._rpc_all("worker", "RunStep", pb.RunStepRequest(step=step))
        sq = [r.sq_sum for r in self._rpc_all("memoryx", "GradNormSq", pb.StepRequest(step=step))]
        norm, coef = clip_coefficient(sq, self.opt.max_gradient_norm)
        loss = sum(r.loss for r in replies)
        check_finite(step + 1, loss=loss, gradient_norm=norm)  # before ApplyUpdate: weights stay finite
        lr = self.opt.learning_rate(step)
        self._rpc_all("memoryx", "ApplyUpdate", pb.UpdateRequest(step=step, learning_rate=lr, clip_coef=coef))
        return {
            "step": step + 1,
            "loss": loss,
            "learning_rate": lr,
            "grad_norm": norm,
            "tokens": sum(r.tokens for r in replies),
            "step_time_s": time.monotonic() - t0,
            "worker_wait_s": max(r.wait_s for r in replies),
            "worker_peak_rss_bytes": max(r.peak_rss_bytes for r in replies),
        }

    def _train(self, start_step: int, t0: float) -> RunSummary:
        rc, cadence = self.rc, Cadence.of(self.params)
        loss = eval_loss = None
        checkpoint: Path | None = None
        tokens_total, t_train = 0, time.monotonic()
        with (self.model_dir / "metrics.jsonl").open("a", encoding="utf-8") as metrics:
            for step in range(start_step, rc.max_steps):
                if self._cancelled.is_set():
                    raise JobCancelled(f"cancelled before step {step + 1}")
                self._check_time_limit(step, t0)
                record = self._step(step)
                done, loss = record["step"], record["loss"]
                tokens_total += record.pop("tokens")
                record["tokens_per_second"] = tokens_total / (time.monotonic() - t_train)
                self._emit("step", **record, max_steps=rc.max_steps)
                if cadence.log(done):
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                    self.log.info(
                        "step %d loss %.5f lr %.3g |g| %.4f",
                        done,
                        loss,
                        record["learning_rate"],
                        record["grad_norm"],
                    )
                if cadence.evaluate(done):
                    eval_loss = self._evaluate(done)
                    metrics.write(json.dumps({"step": done, "eval_loss": eval_loss}) + "\n")
                    metrics.flush()
                if cadence.checkpoint(done):
                    checkpoint = self._checkpoint(done)
        if start_step >= rc.max_steps:
            found = last_checkpoint(self.model_dir)
            checkpoint = found[1] if found else None
        steps_run = max(0, rc.max_steps - start_step)
        return RunSummary(
            steps_run, start_step, rc.max_steps, loss, eval_loss, checkpoint, time.monotonic() - t0
        )

    def _check_time_limit(self, done: int, t0: float) -> None:
        """Fail the job once its wall-clock limit is spent (``t0``: when this run began, monotonic)."""
        limit = self.time_limit_s
        if limit is None or self.time_used_s + time.monotonic() - t0 <= limit:
            return
        last = last_checkpoint(self.model_dir)
        where = f"its last checkpoint is {last[1]} (step {last[0]})" if last else "it wrote no checkpoint"
        raise JobFailed(f"job exceeded its wall-clock limit of {limit:g} s at step {done}; {where}")

    def _evaluate(self, step: int) -> float:
        n = self.rc.eval_steps
        eval_loss = (
            sum(r.loss for r in self._rpc_all("worker", "Evaluate", pb.EvalRequest(step=step, batch=n))) / n
        )
        check_finite(step, eval_loss=eval_loss)
        self.log.info("step %d eval_loss %.5f", step, eval_loss)
        self._emit("eval", step=step, eval_loss=eval_loss)
        return eval_loss

    def _checkpoint(self, step: int) -> Path:
        tmp = partial_dir(self.model_dir, step)
        k = self.rc.num_wgt_servers

        def request(i: int) -> pb.CheckpointRequest:
            return pb.CheckpointRequest(
                step=step,
                directory=str(tmp.resolve()),
                model_file=shard_file_name("model", i, k),
                optimizer_file=shard_file_name("optimizer", i, k),
            )

        replies = self._rpc_all("memoryx", "SaveCheckpoint", request)
        names = [{"model": list(r.tensor_names), "optimizer": list(r.state_names)} for r in replies]
        state = {
            "num_csx": self.rc.num_csx,
            "num_wgt_servers": k,
            "seed": self.rc.seed,
            "optimizer_type": self.opt.kind,
            "weightstream_format": 1,
        }
        path = finish_checkpoint(self.model_dir, tmp, step, self.params, names, state)
        self.log.info("checkpoint %s", path)
        prune_checkpoints(self.model_dir, self.rc.keep_checkpoint_max, path, self.log)
        self._emit("checkpoint", step=step, path=str(path))
        return path

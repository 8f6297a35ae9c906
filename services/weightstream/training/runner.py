"""Run one job: plan it, start its roles through a backend, drive the steps (``training.stepping``),
evaluate, checkpoint, and recover from the loss of any role on the way (``training.recovery``).

A step interrupted by a fault is run again under a new generation; its first attempt's gradients are
refused wherever they still arrive, so each step is applied exactly once whatever happens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from weightstream.backends.base import Backend, BackendError, RoleSpec
from weightstream.checkpoint_layout import last_checkpoint, recovery_dir
from weightstream.hf_checkpoint import StartCheckpointError
from weightstream.params import Params, dump_params, model_def, optimizer_config
from weightstream.plan import make_plan
from weightstream.storage_io import write_text_durably
from weightstream.training.cadence import Cadence
from weightstream.training.checkpoints import (
    finish_checkpoint,
    partial_dir,
    prune_checkpoints,
    refuse_weights_only,
    remove_recovery_snapshots,
    trainer_state,
    trim_metrics,
    written_files,
)
from weightstream.training.divergence import check_finite
from weightstream.training.elastic import ElasticWorkers
from weightstream.training.errors import JobCancelled, JobFailed, RoleFault
from weightstream.training.events import (
    CheckpointEvent,
    EvalEvent,
    EventSink,
    ResumingEvent,
    RunningEvent,
    StartingEvent,
    StartingFromEvent,
    StepEvent,
)
from weightstream.training.hf_start import check_start_checkpoint
from weightstream.training.metrics_writer import MetricsWriter
from weightstream.training.records import EvalRecord, StepRecord
from weightstream.training.recovery import Recovery, RestartBudget
from weightstream.training.roles import RolePlane
from weightstream.training.run_state import PostStep, RunState
from weightstream.training.stepping import StepDriver
from weightstream.training.stragglers import StragglerWatch, straggler_event
from weightstream.transport.auth import new_role_token

__all__ = ["JobCancelled", "JobFailed", "JobRunner", "RunSummary", "job_log"]

log = logging.getLogger("weightstream.training")


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
    restarts: int = 0


class JobRunner:
    # Where the run stands between steps, and the files its records go to: both made as training begins
    # (``_train``), once the roles are configured.
    state: RunState
    metrics: MetricsWriter

    def __init__(
        self,
        params: Params,
        backend: Backend,
        on_event: EventSink | None = None,
        job_id: str = "local",
        time_limit_s: float | None = None,
        time_used_s: float = 0.0,
    ) -> None:
        """``on_event``: called with each event of the run (``training.events``), on the thread that runs
        it. ``time_limit_s``: the job's wall-clock limit (None: none), of which earlier runs of it (before a
        service restart) used ``time_used_s``; checked before every step."""
        self.params, self.backend, self.job_id = params, backend, job_id
        self.time_limit_s, self.time_used_s = time_limit_s, time_used_s
        self.on_event: EventSink = on_event or (lambda e: None)
        self.rc = params.runconfig
        self.model = model_def(params)
        self.opt = optimizer_config(params.optimizer)
        self.plan = make_plan(params, self.model)
        self.model_dir = Path(self.rc.model_dir)
        self.cadence = Cadence.of(params)
        self._cancelled = threading.Event()
        self.log = log.getChild(job_id)  # one logger per job: a service runs several at once
        self.budget = RestartBudget(self.rc.max_role_restarts)
        self.stragglers = StragglerWatch()

    def cancel(self) -> None:
        """Stop the job from another thread: its roles are stopped at once, ``run`` raises JobCancelled."""
        self._cancelled.set()
        self.backend.stop()

    def stop(self) -> None:
        """Stop the job's roles from another thread (the service is shutting down); ``run`` fails, and
        the checkpoints written so far stay for a resume."""
        self.backend.stop()

    @property
    def addresses(self) -> dict[str, list[str]]:
        """Every role's address, by kind, once the roles run (replacements included)."""
        return self.roles.addresses

    # -- the job -------------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        t0 = time.monotonic()
        self.model_dir.mkdir(parents=True, exist_ok=True)
        write_text_durably(self.model_dir / "params.yaml", dump_params(self.params))
        remove_recovery_snapshots(self.model_dir)  # an earlier run's scratch
        resume = last_checkpoint(self.model_dir) if self.rc.autoload_last_checkpoint else None
        start_step = resume[0] if resume else 0
        if resume:
            refuse_weights_only(resume[1])
            self.log.info("resuming from %s", resume[1])
            self.on_event(ResumingEvent(checkpoint=str(resume[1]), step=start_step))
        elif self.rc.checkpoint_path is not None:  # checked before any role starts; the shards load it
            try:
                notes = check_start_checkpoint(self.params, self.model, self.rc.checkpoint_path)
            except StartCheckpointError as e:
                raise JobFailed(str(e)) from None
            for note in notes:
                self.log.info("%s", note)
            self.on_event(StartingFromEvent(checkpoint=self.rc.checkpoint_path, step=0))
        # the steps after the start run again (all of them from step 0: an earlier attempt that left no
        # checkpoint, or autoload_last_checkpoint false), so their records of an earlier attempt go
        trim_metrics(self.model_dir / "metrics.jsonl", start_step)
        roles = [RoleSpec(kind, i) for kind, i in self.plan.roles()]
        self.on_event(StartingEvent(roles=self.plan.counts()))
        # a new role credential for every start: roles of an earlier run of this job cannot join this one
        self.credential = credential = new_role_token()
        self.roles = RolePlane(
            self.backend,
            self.plan,
            self.params.model_dump(mode="json"),
            self.job_id,
            credential,
            self.rc.rpc_timeout_s,
            self.rc.heartbeat_timeout_s,
        )
        self.steps = StepDriver(self.roles, self.opt)
        self.elastic = ElasticWorkers(
            self.roles, self.params, self.model, self.log, self.on_event, self._cancelled, self._wait_ready
        )
        self.recovery = Recovery(
            self.roles,
            self.budget,
            self.log,
            self.on_event,
            self._cancelled,
            self._wait_ready,
            self._snapshot,
            self.elastic,
        )
        try:
            if self._cancelled.is_set():
                raise JobCancelled("cancelled before it started")
            try:
                self.backend.start(roles, credential)
            except BackendError as e:  # no room for the job, a scheduler refusing it: the job fails
                raise JobFailed(str(e)) from e
            self.roles.configure(self._wait_ready(), str(resume[1]) if resume else None)
            # only now, with every role ready: spares starting earlier would slow the job's own start
            self.backend.keep_standby(self.rc.standby_roles)
            self.on_event(RunningEvent(addresses=self.roles.addresses))
            return self._train(start_step, resume[1] if resume else None, t0)
        except JobFailed as e:
            if self._cancelled.is_set():
                raise JobCancelled("cancelled") from e
            raise
        finally:
            self.backend.stop()
            self.roles.close()
            remove_recovery_snapshots(self.model_dir)
            self._log_heartbeats()

    def _log_heartbeats(self) -> None:
        """How close the roles came to being taken for hung: the run's slowest heartbeat answer, and the
        longest a role went without answering."""
        beats = self.roles.heartbeats
        if beats.answers:
            self.log.info(
                "heartbeats: %d answers, the slowest in %.3fs (%s), the longest silence %.2fs (%s); "
                "a role silent for %gs is hung",
                beats.answers,
                *beats.slowest,
                *beats.longest_silence,
                beats.timeout_s,
            )

    def _wait_ready(self) -> dict[str, list[str]]:
        """Every process's address by process index once all of the job's listen (``RolePlane.placed``)."""
        try:
            return self.roles.placed(self.backend.wait_ready(timeout_s=min(120.0, self.rc.rpc_timeout_s)))
        except BackendError as e:
            if self._cancelled.is_set():
                raise JobCancelled("cancelled while starting") from e
            raise JobFailed(str(e)) from e

    def _step(self, step: int) -> StepRecord:
        """Train step ``step`` (0-based) through its update (``training.stepping``); returns its record."""
        return self.steps.step(step, next_is_step=self._next_is_step(step))

    def _next_is_step(self, step: int) -> bool:
        """Whether, once step ``step`` is committed, the run's next action is step ``step + 1``: then that
        step's RunStep may overlap this step's update."""
        done = step + 1
        if self.state.at != step or self.state.done != step:  # a replay after a fault
            return False
        if self.elastic.wants_boundary:  # workers join before the next step: nothing may be sent ahead
            return False
        return done < self.rc.max_steps and not self._after(done) and not self._cancelled.is_set()

    def _after(self, done: int) -> list[PostStep]:
        """What the run does after step ``done`` (1-based) is committed, before the next step."""
        every = self.rc.recovery_snapshot_steps
        post: list[PostStep] = ["eval"] if self.cadence.evaluate(done) else []
        if self.cadence.checkpoint(done):
            post.append("checkpoint")
        elif every and done % every == 0:  # a checkpoint is a recovery point already
            post.append("snapshot")
        return post

    def _train(self, start_step: int, resume: Path | None, t0: float) -> RunSummary:
        """Run from step ``start_step`` (held by the checkpoint ``resume``; None: the seed's weights)
        to ``max_steps``; ``t0``: when this run began (monotonic)."""
        rc = self.rc
        self.state = state = RunState.begin(start_step, resume, rc.save_initial_checkpoint)
        batch = self.params.train_input.batch_size
        with MetricsWriter(self.model_dir, start_step, batch, self.cadence.has_eval) as self.metrics:
            while state.replaying or state.post or state.done < rc.max_steps:
                if self._cancelled.is_set():
                    raise JobCancelled(f"cancelled before step {state.done + 1}")
                try:
                    if state.replaying:  # after a rollback: replay, checking each loss
                        self._replay(self._step(state.at))
                    elif state.post:
                        self._post_step(state.post[0])
                        state.post.pop(0)
                    else:
                        self._check_time_limit(state.done, t0)
                        self.elastic.at_boundary(state.done, self.steps.sent_ahead)
                        self._commit(self._step(state.done))
                except RoleFault as e:
                    self._recover(e)
        if self.steps.overlapped:
            self.log.info(
                "%d steps started while the previous step's update was being applied (training.stepping)",
                self.steps.overlapped,
            )
        checkpoint = state.checkpoint
        if start_step >= rc.max_steps:
            found = last_checkpoint(self.model_dir)
            checkpoint = found[1] if found else None
        steps_run = max(0, rc.max_steps - start_step)
        return RunSummary(
            steps_run,
            start_step,
            rc.max_steps,
            state.last_loss,
            state.eval_loss,
            checkpoint,
            time.monotonic() - t0,
            self.budget.restarts,
        )

    def _commit(self, record: StepRecord) -> None:
        """Step ``record.step`` is applied on every shard: log it, and queue what follows it."""
        done = record.step
        self.budget.step_completed()
        tokens_per_second = self.state.commit(record)
        self.on_event(StepEvent(record, tokens_per_second, self.rc.max_steps))
        if self.cadence.log(done):
            self.metrics.step(record, tokens_per_second)
            self.log.info(
                "step %d loss %.5f lr %.3g |g| %.4f%s",
                done,
                record.loss,
                record.learning_rate,
                record.grad_norm,
                f" ({record.workers} of {self.rc.num_csx} workers)"
                if record.workers < self.rc.num_csx
                else "",
            )
        self.steps.committed()
        self.state.post = self._after(done)
        if (slot := self.stragglers.observe_record(record)) is not None:
            self.on_event(straggler_event(self.roles, record, slot, self.stragglers.run, self.log))

    def _replay(self, record: StepRecord) -> None:
        self.budget.step_completed()
        self.state.replayed(record)  # raises JobFailed if the loss differs from the first run's
        if not self.state.replaying:
            self.log.info("replayed to step %d; training goes on", self.state.done)

    def _post_step(self, action: PostStep) -> None:
        state = self.state
        done = state.done
        if action == "eval":
            state.eval_loss = self._evaluate(done)
            self.metrics.eval(EvalRecord(done, state.eval_loss))
        elif action == "checkpoint":
            state.checkpoint = self._save(done, snapshot=False)
            if not self.rc.checkpoint_optimizer_state:
                return  # weights only: recovery cannot start from it, so the recovery point stays
            state.new_recovery_point(state.checkpoint)
            remove_recovery_snapshots(self.model_dir)
        else:
            self._snapshot(done)

    def _snapshot(self, step: int) -> Path:
        """A recovery snapshot of ``step``, every shard being at it, made the newest recovery point."""
        path = self._save(step, snapshot=True)
        self.state.new_recovery_point(path, step)
        remove_recovery_snapshots(self.model_dir, keep=path)
        return path

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
        eval_loss = sum(self.roles.workers.evaluate(step, n)) / n
        check_finite(step, eval_loss=eval_loss)
        self.log.info("step %d eval_loss %.5f", step, eval_loss)
        self.on_event(EvalEvent(step=step, eval_loss=eval_loss))
        return eval_loss

    def _save(self, step: int, snapshot: bool) -> Path:
        """A checkpoint of ``step``, or a recovery snapshot (the same files, kept while the run lasts)."""
        tmp = partial_dir(self.model_dir, step)
        # a recovery snapshot always holds the optimizer state: recovery resumes from it
        weights_only = not snapshot and not self.rc.checkpoint_optimizer_state
        replies = self.roles.memoryx.save_checkpoint(step, str(tmp.resolve()), weights_only)
        state = trainer_state(self.rc, self.opt.kind, weights_only)
        final = recovery_dir(self.model_dir, step) if snapshot else None
        path = finish_checkpoint(self.model_dir, tmp, step, self.params, written_files(replies), state, final)
        if snapshot:
            # routine scratch, every few steps and gone at the end: below run.log's INFO, which keeps
            # what a user reads (steps, checkpoints, evaluations, faults and the recoveries from these)
            self.log.debug("recovery snapshot %s", path)
            return path
        self.log.info("checkpoint %s", path)
        prune_checkpoints(self.model_dir, self.rc.keep_checkpoint_max, path, self.log)
        self.on_event(CheckpointEvent(step=step, path=str(path)))
        return path

    # -- recovery ------------------------------------------------------------------------------------------
    def _recover(self, fault: RoleFault) -> None:
        """Replace what ``fault`` cost and bring the shards to an agreed step (``training.recovery``)."""
        state = self.state
        applying = self.steps.interrupted()  # the step whose update was in flight, if any
        at = self.recovery.recover(
            fault, state.at, state.done, applying.step - 1 if applying else None, state.recovery_point
        )
        if applying is not None and at == state.at + 1:  # the update had landed on every shard
            (self._replay if state.replaying else self._commit)(applying)
        else:
            state.at = at

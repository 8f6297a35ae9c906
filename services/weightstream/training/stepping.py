"""One training step as the coordinator drives it, and the overlap of its update with the next step.

Step s (every call with the job's deadline):
  1. RunStep(s) on every worker (they pull weights through SwarmX and push gradients back)
  2. GradNormSq(s) on every MemoryX shard, sent with RunStep(s) (each answers once its gradients are
     complete); with RunStep's replies in, the clip coefficient and the divergence check (before any
     weight changes)
  3. ApplyUpdate(s, lr, clip coefficient) on every shard: the step is applied exactly once

The norm is asked for as soon as RunStep(s) is under way, not once it has returned: a shard answers it when
its last gradient is in, so the step's boundary loses no round trip to it (RunStep's reply, its loss in
particular, is still awaited before the divergence check and ApplyUpdate). At GPT-2 d512/L4 ApplyUpdate
then reaches the shard ~1 ms sooner (traced): the norm is in about when the workers' replies are, the
embedding's two parts being added and squared meanwhile.

Overlap: when the run's next action is step s + 1 (no evaluation, checkpoint or snapshot after s, not the last
step, not a replay), RunStep(s + 1) is sent as soon as RunStep(s) has returned. A shard serves each tensor of
step s + 1 as soon as its own update is done (memoryx/shard.py, embedding first; until then the request waits
there), so the workers' forward runs while the shards apply the rest of the update instead of waiting for all
of it, and their requests for the first unit are already at the shards when its update is done: sent after
ApplyUpdate(s), each crossed coordinator, worker and SwarmX while the embedding was being updated, and arrived
~4 ms after it was (GPT-2 d512/L4, measured). The math is unchanged (every weight a worker reads is the
updated one), so results are bitwise those of the sequential order. Step s is still committed only once
ApplyUpdate(s) has returned everywhere; a fault meanwhile is recovered as before (the update in flight is
what ``interrupted`` returns), and the early RunStep(s + 1) is dropped with the configuration that sent it.
A diverged step s ends the run before any update: its early RunStep(s + 1) waits for weights that never
come, until the run stops the roles.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import replace

from weightstream.numerics import OptimizerConfig
from weightstream.numerics.optim import clip_coefficient
from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.divergence import check_finite
from weightstream.training.records import StepRecord
from weightstream.training.roles import RolePlane
from weightstream.training.stragglers import slowest_worker

__all__ = ["StepDriver"]


class StepDriver:
    def __init__(self, roles: RolePlane, opt: OptimizerConfig) -> None:
        self.roles, self.opt = roles, opt
        self._applying: StepRecord | None = None  # the step whose update is in flight
        # (step, its RunStep replies to come): the RunStep sent ahead, if any
        self._early: tuple[int, Future[list[pb.RunStepReply]]] | None = None
        self._last_end = 0.0  # when the run committed the previous step (``committed``)
        self.overlapped = 0  # steps whose RunStep overlapped the previous update (for tests, operators)

    def committed(self) -> None:
        """The run has committed (logged) the step this driver last ran: a step sent ahead begins now."""
        self._last_end = time.monotonic()

    @property
    def sent_ahead(self) -> bool:
        """Whether the next step's RunStep is already out (a new configuration now would cancel it)."""
        return self._early is not None

    def interrupted(self) -> StepRecord | None:
        """A fault ended the step under way: forget it, and the RunStep sent ahead if any (the new
        configuration cancels it). Returns the record of the step whose update was in flight, if the fault
        came then: the update may have landed on every shard (``Recovery.recover`` finds out)."""
        applying, self._applying, self._early = self._applying, None, None
        return applying

    def _start_workers(self, step: int) -> tuple[float, Future[list[pb.RunStepReply]]]:
        """(when the step began, the workers' replies to come): the RunStep sent ahead, if any. A step sent
        ahead begins, in ``step_time_s``, when the run committed the previous one: the overlap counts in
        the previous step, so each step's time lies within its commit-to-commit interval, as without it."""
        early, self._early = self._early, None
        if early is not None and early[0] == step:
            self.overlapped += 1
            return self._last_end, early[1]
        t0 = time.monotonic()
        return t0, self._run_step(step)

    def _run_step(self, step: int) -> Future[list[pb.RunStepReply]]:
        """RunStep(``step``) on every worker, in the background: the calls of a step overlap (module doc)."""
        return self.roles.submit(lambda: self.roles.workers.run_step(step))

    def step(self, step: int, next_is_step: bool) -> StepRecord:
        """Train step ``step`` (0-based) through its update; returns its record. With
        ``next_is_step`` (the run's next action is step ``step + 1``) that step's RunStep is sent as soon
        as this step's has returned."""
        t0, running = self._start_workers(step)
        # the shards are at ``step`` (its predecessor's update has returned): each answers once its
        # gradients are in. A fault meanwhile fails this call with the configuration that made it
        norms = self.roles.submit(lambda: self.roles.memoryx.grad_norm_sq(step))
        replies = running.result()
        if next_is_step:  # the workers wait at the shards for step + 1's weights (see the module's doc)
            self._early = (step + 1, self._run_step(step + 1))
        t_update = time.monotonic()
        sq = norms.result()
        norm, coef = clip_coefficient(sq, self.opt.max_gradient_norm)
        loss = sum(r.loss for r in replies)
        check_finite(step + 1, loss=loss, gradient_norm=norm)  # before ApplyUpdate: weights stay finite
        lr = self.opt.learning_rate(step)
        slowest, ratio, lag = slowest_worker([r.compute_s + r.wait_s for r in replies])
        record = StepRecord(
            step=step + 1,
            loss=loss,
            learning_rate=lr,
            grad_norm=norm,
            tokens=sum(r.tokens for r in replies),
            step_time_s=0.0,
            worker_wait_s=max(r.wait_s for r in replies),
            worker_compute_s=max(r.compute_s for r in replies),
            update_s=0.0,
            worker_peak_rss_bytes=max(r.peak_rss_bytes for r in replies),
            worker_wire_bytes=sum(r.wire_bytes for r in replies),
            workers=len(replies),
            slowest_worker=slowest,
            slowest_worker_ratio=ratio,
            slowest_worker_lag_s=lag,
        )
        self._applying = record
        # only the shards take part from here: a worker lost now is replaced before the next step
        self.roles.memoryx.apply_update(step, lr, coef, watch=False)
        self._applying = None
        t1 = time.monotonic()
        return replace(record, step_time_s=t1 - t0, update_s=t1 - t_update)  # update: norm and optimizer

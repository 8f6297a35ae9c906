"""Where one run of a job stands between its steps; ``runner.JobRunner`` holds one, made as training begins.

Two step counts, both updates applied: ``at``, what every MemoryX shard holds, and ``done``, what this run has
committed (logged, and told its caller). They differ only after a rollback (a shard was lost, every shard
went back to the recovery point): the steps from ``at`` to ``done`` then run again, and each replayed loss
must equal the one first committed, or the job cannot recover exactly. A step replayed with another number
of workers than its first run (training/elastic.py) sums its gradients in another split and order, so its
loss can only agree to rounding: within ``ELASTIC_REPLAY_RTOL``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from weightstream.training.errors import JobFailed
from weightstream.training.records import StepRecord

__all__ = ["PostStep", "RunState"]

PostStep = Literal["eval", "checkpoint", "snapshot"]  # what a run may do after a step, before the next
# a replayed step's loss against its first run's when the two had different numbers of workers: float32
# rounding of other reduction splits, over the few steps since a recovery point, stays far below this
ELASTIC_REPLAY_RTOL = 1e-3


@dataclass(slots=True)  # a misspelled field is an error, not a new attribute
class RunState:
    at: int  # steps every shard holds
    done: int  # steps this run has committed
    # (step, directory) the shards go back to when one is lost; None: the seed's initial weights
    recovery_point: tuple[int, Path | None]
    post: list[PostStep] = field(default_factory=list)  # still to do after step ``done``, in order
    losses: dict[int, float] = field(default_factory=dict)  # by step (0-based), since the recovery point
    workers: dict[int, int] = field(default_factory=dict)  # the workers of each step in ``losses``
    last_loss: float | None = None
    eval_loss: float | None = None
    checkpoint: Path | None = None  # the newest checkpoint this run wrote
    tokens: int = 0  # counted target tokens of the steps this run has committed
    t_train: float = field(default_factory=time.monotonic)  # when training began (monotonic seconds)

    @classmethod
    def begin(cls, start_step: int, resume: Path | None, initial_checkpoint: bool) -> RunState:
        """Training begins now at ``start_step``, which the checkpoint ``resume`` holds (None: the seed's
        weights at step 0). ``initial_checkpoint``: a run from step 0 first writes checkpoint_0, the
        weights it starts from."""
        post: list[PostStep] = ["checkpoint"] if start_step == 0 and initial_checkpoint else []
        return cls(start_step, start_step, (start_step, resume), post)

    @property
    def replaying(self) -> bool:
        """Whether the shards are behind the committed steps (after a rollback)."""
        return self.at < self.done

    def commit(self, record: StepRecord) -> float:
        """Step ``record.step`` is applied on every shard and committed; returns this run's throughput
        since training began, in tokens per second."""
        self.at = self.done = record.step
        self.losses[record.step - 1] = self.last_loss = record.loss
        self.workers[record.step - 1] = record.workers
        self.tokens += record.tokens
        return self.tokens / (time.monotonic() - self.t_train)

    def replayed(self, record: StepRecord) -> None:
        """Step ``record.step`` ran again after a rollback; raises JobFailed if its loss differs from the
        one first committed (then training is not deterministic here)."""
        step = record.step - 1
        self.at = record.step
        first = self.losses.get(step)
        if first is None:
            return
        split = self.workers.get(step, record.workers)
        if split != record.workers:  # another split of the batch: equal to rounding only
            if abs(record.loss - first) > ELASTIC_REPLAY_RTOL * abs(first):
                raise JobFailed(
                    f"step {step + 1} replayed after a fault with {record.workers} workers gave loss "
                    f"{record.loss!r}, its first run with {split} workers {first!r}: more apart than "
                    f"rounding ({ELASTIC_REPLAY_RTOL:g} relative), so the job cannot recover"
                )
        elif record.loss != first:
            raise JobFailed(
                f"step {step + 1} replayed after a fault gave loss {record.loss!r}, its first run "
                f"{first!r}: training is not deterministic here, so the job cannot recover exactly"
            )

    def new_recovery_point(self, path: Path, step: int | None = None) -> None:
        """The shards can go back to step ``step`` (default ``done``) from ``path``: the losses of the
        steps before it need no more checking."""
        at = self.done if step is None else step
        self.recovery_point = (at, path)
        self.losses = {s: v for s, v in self.losses.items() if s >= at}
        self.workers = {s: n for s, n in self.workers.items() if s >= at}

"""The events a job's run emits as it goes: its phases, each committed step, evaluations, checkpoints and
fault recovery.

``JobRunner(on_event=...)`` hands each one, typed, to its caller: the console prints them, the job service
stores them (the REST and gRPC event streams, the Prometheus metrics), benches time them. A consumer matches
on the class and reads attributes. An event becomes JSON only where it leaves the process: ``data()`` is what
the job service stores as the event's data under its ``kind`` (a status event's kind is ``progress`` there),
``to_dict()`` the same with ``"event": kind`` first. Keys, in order:

  status      status ("starting": roles; "starting_from": checkpoint, step; "resuming": checkpoint, step;
              "running": addresses)
  step        the ``StepRecord``'s fields (``records``), tokens_per_second, max_steps
  eval        step, eval_loss
  checkpoint  step, path
  restart     role, role_kind, step, reason, restarts, max_role_restarts, fault, host
  retry       step, reason
  recovered   step, replay_steps, recovery_s, generation, restarts, addresses, action
  workers     step, from_workers, to_workers, reason
  straggler   step, worker, host, ratio, steps
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from weightstream.training.records import StepRecord

__all__ = [
    "CheckpointEvent",
    "EvalEvent",
    "EventKind",
    "EventSink",
    "FaultKind",
    "JobEvent",
    "RecoveredEvent",
    "RestartEvent",
    "ResumingEvent",
    "RetryEvent",
    "RunningEvent",
    "StartingEvent",
    "StartingFromEvent",
    "StatusEvent",
    "StepEvent",
    "StragglerEvent",
    "WorkersEvent",
]

EventKind = Literal[
    "status", "step", "eval", "checkpoint", "restart", "retry", "recovered", "workers", "straggler"
]
# how a role was lost: its process ended (killed, crashed, evicted), or it stopped answering (stopped,
# partitioned, its host gone) and was killed
FaultKind = Literal["died", "hung"]
Addresses = dict[str, list[str]]  # every role's address, by kind


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event; ``kind`` names it on the wire. Its fields are its data, in their order."""

    kind: ClassVar[EventKind]

    def data(self) -> dict[str, Any]:
        """The event's data as the job service stores it: JSON-ready, without its kind."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """``{"event": kind, **data()}``."""
        return {"event": self.kind, **self.data()}


EventSink = Callable[[JobEvent], None]


# -- the run's phases ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StatusEvent(JobEvent):
    """A phase of the run before its first step; ``status`` names which, ahead of the fields."""

    kind: ClassVar[EventKind] = "status"
    status: ClassVar[str]

    def data(self) -> dict[str, Any]:
        return {"status": self.status, **JobEvent.data(self)}


@dataclass(frozen=True, slots=True)
class ResumingEvent(StatusEvent):
    """The run resumes from ``checkpoint``, the newest of its model_dir, at ``step``."""

    status: ClassVar[str] = "resuming"
    checkpoint: str
    step: int


@dataclass(frozen=True, slots=True)
class StartingFromEvent(StatusEvent):
    """A fresh run starts from the weights of ``checkpoint`` (``runconfig.checkpoint_path``), at step 0."""

    status: ClassVar[str] = "starting_from"
    checkpoint: str
    step: int


@dataclass(frozen=True, slots=True)
class StartingEvent(StatusEvent):
    """The roles are being started: how many of each kind."""

    status: ClassVar[str] = "starting"
    roles: dict[str, int]


@dataclass(frozen=True, slots=True)
class RunningEvent(StatusEvent):
    """Every role is configured and serving; training begins."""

    status: ClassVar[str] = "running"
    addresses: Addresses


# -- training ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepEvent(JobEvent):
    """A step committed (applied on every shard, not a replay), logged or not."""

    kind: ClassVar[EventKind] = "step"
    record: StepRecord
    tokens_per_second: float  # tokens committed by this run over the time since its first step began
    max_steps: int

    def data(self) -> dict[str, Any]:
        return {
            **self.record.to_dict(),
            "tokens_per_second": self.tokens_per_second,
            "max_steps": self.max_steps,
        }


@dataclass(frozen=True, slots=True)
class EvalEvent(JobEvent):
    """The mean eval loss after step ``step`` (1-based)."""

    kind: ClassVar[EventKind] = "eval"
    step: int
    eval_loss: float


@dataclass(frozen=True, slots=True)
class CheckpointEvent(JobEvent):
    """A checkpoint of step ``step`` is complete in directory ``path`` (recovery snapshots are not)."""

    kind: ClassVar[EventKind] = "checkpoint"
    step: int
    path: str


# -- fault recovery ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RestartEvent(JobEvent):
    """Role ``role`` was lost during step ``step`` (1-based) and is being replaced: the run's
    ``restarts``-th replacement of at most ``max_role_restarts``."""

    kind: ClassVar[EventKind] = "restart"
    role: str  # e.g. "worker-1"
    role_kind: str
    step: int
    reason: str  # how it was lost, and where its log is
    restarts: int
    max_role_restarts: int
    fault: FaultKind = "died"
    host: str = ""  # the host it ran on, as its ready file says ("" where unknown)


@dataclass(frozen=True, slots=True)
class RetryEvent(JobEvent):
    """Step ``step`` (1-based) failed with every role alive, for ``reason``; it runs again."""

    kind: ClassVar[EventKind] = "retry"
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveredEvent(JobEvent):
    """The roles are back under ``generation``; every shard holds ``step`` (updates applied) and the run
    replays ``replay_steps`` steps before it goes on."""

    kind: ClassVar[EventKind] = "recovered"
    step: int
    replay_steps: int
    recovery_s: float  # seconds it took: finding what was lost, replacing it, configuring every role
    generation: int
    restarts: int  # replacements so far in this run
    addresses: Addresses  # every role's, a replacement's new one included (the dashboard shows it)
    # what was done, in words: the roles replaced, a shard's failover to its replica, a rollback
    action: str = ""


@dataclass(frozen=True, slots=True)
class WorkersEvent(JobEvent):
    """The job trains with ``to_workers`` workers from step ``step`` (1-based) on, ``from_workers`` before:
    fewer when a lost worker found no capacity to start again (``runconfig.min_num_csx``), back up when
    capacity returned. The global batch is the same, split across ``to_workers``."""

    kind: ClassVar[EventKind] = "workers"
    step: int
    from_workers: int
    to_workers: int
    reason: str  # why, in words: the workers left out and for want of what, or those started again


# -- stragglers --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StragglerEvent(JobEvent):
    """Worker ``worker`` on ``host`` has held the steps back for ``steps`` steps running, up to step ``step``
    (1-based): its time in each was at least ``training.stragglers.STRAGGLER_RATIO`` times the other
    workers' median, ``ratio`` times in the last. Emitted once per such stretch."""

    kind: ClassVar[EventKind] = "straggler"
    step: int
    worker: str  # e.g. "worker-1"
    host: str  # the host it runs on, as it names itself
    ratio: float
    steps: int

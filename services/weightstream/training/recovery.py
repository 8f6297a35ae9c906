"""Fault recovery's bookkeeping: which roles were replaced, when and why; the restart budget; backoff.

How the runner recovers (``runner.JobRunner._recover``):
  1. find what is wrong: roles the backend reports dead, and hung roles (SIGSTOPped, partitioned), which
     are killed: those that have not answered heartbeats for ``runconfig.heartbeat_timeout_s``
     (training/heartbeats.py), and those that do not answer a Health probe within that long;
  2. ask this budget: past ``runconfig.max_role_restarts`` replacements, or when a replaced role dies again
     before the job has completed a step since (a bad config, a data error), the job fails with the whole
     history; a role replaced again soon waits a backoff first;
  3. replace the lost roles through the backend and configure every role again under a new generation, so
     nothing of the interrupted attempt counts (``transport.fencing``); a worker the backend has no room
     for within ``runconfig.elastic_wait_s`` is left out where ``runconfig.min_num_csx`` allows, and the job
     goes on with fewer workers (training/elastic.py);
  4. MemoryX survived: the shards keep their state and the interrupted step runs again. A shard lost the
     process serving it but has a replica (``runconfig.memoryx_replicas``): the replica, which holds the
     same state bit for bit, serves the shard from now on, and the replacement process becomes the new
     replica, given the shards' state through a recovery snapshot; no step is replayed. A shard's state
     was lost (no replica, or both lost): every shard goes back to the newest recovery point (snapshot,
     checkpoint, or the seed's initial weights) and the steps since are replayed; training is
     deterministic, so the replay reproduces them bit for bit (the runner checks each replayed loss
     against the first one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from weightstream.backends.base import BackendError, RoleSpec, ready_file
from weightstream.plan import REPLICA
from weightstream.training.elastic import ElasticWorkers
from weightstream.training.errors import JobCancelled, JobFailed, RoleFault
from weightstream.training.events import EventSink, RecoveredEvent, RestartEvent, RetryEvent
from weightstream.training.heartbeats import Heartbeats
from weightstream.training.roles import RolePlane

__all__ = ["Fault", "Recovery", "RestartBudget", "is_transient"]

PROBE_TIMEOUT_S = 5.0  # how long a shard may take to say which step it holds, once configured again
HUNG = "(hung)"  # in the words of every loss of a role that was there but did not answer
REFUSED_S = 0.25  # a server that is closed refuses a call within this (loopback, or a LAN's round trip)
EXIT_GRACE_S = 2.0  # how long a role that does not answer may take to be seen dead before it counts as hung

# status codes of a failed call that a retry may cure; any other (INVALID_ARGUMENT, PERMISSION_DENIED, ...)
# says the request itself is wrong, and the same request would fail again
_TRANSIENT = ("DEADLINE_EXCEEDED", "UNAVAILABLE", "ABORTED", "CANCELLED", "RESOURCE_EXHAUSTED")
# restarts of one role within this long count towards its backoff, unless the job has completed
# _PROVEN_STEPS steps since: a replacement that trained that long was sound, and a later fault of the same
# role is a new one (a loop of faults is what the backoff slows, and one with fewer steps between is one)
_BACKOFF_WINDOW_S = 300.0
_PROVEN_STEPS = 10
_BACKOFF_BASE_S, _BACKOFF_MAX_S = 0.5, 30.0


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (a failed call, as the runner saw it) may go away when the step runs again."""
    text = str(error)
    return isinstance(error, TimeoutError) or any(code in text for code in _TRANSIENT)


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds since the run began
    step: int  # the step in progress (0-based), or the step evaluated or checkpointed
    role: str  # e.g. "worker-1"; "-" for a failed attempt with no role lost
    how: str

    def line(self) -> str:
        return f"{self.at_s:8.1f}s step {self.step + 1}: {self.role} {self.how}"


class RestartBudget:
    """Admits replacements until ``max_restarts``; remembers every fault for the failure message."""

    def __init__(self, max_restarts: int, clock: float | None = None) -> None:
        self.max_restarts = max_restarts
        self.t0 = time.monotonic() if clock is None else clock
        self.history: list[Fault] = []
        self.restarts = 0
        self.by_kind: dict[str, int] = defaultdict(int)
        # each role's restarts: (monotonic time, steps completed before it)
        self._recent: dict[RoleSpec, list[tuple[float, int]]] = defaultdict(list)
        self._steps = 0  # steps completed in this run
        self._since_step: set[RoleSpec] = set()  # replaced, and no step has completed since
        self._retried_step: int | None = None  # a step re-run after a failure with no role lost

    def fail(self, why: str) -> JobFailed:
        """The error that ends the job: ``why``, then the run's fault history."""
        shown = self.history[-40:]
        lines = "\n".join(f.line() for f in shown)
        more = f"\n(and {len(self.history) - len(shown)} earlier)" if len(self.history) > len(shown) else ""
        return JobFailed(f"{why}\nfaults of this run:\n{lines}{more}")

    def admit(self, lost: dict[RoleSpec, str], step: int, error: BaseException | None) -> float:
        """Record the roles ``lost`` at ``step`` (empty: a step failed with every role alive, ``error``
        saying how). Returns the backoff to wait before replacing them; raises JobFailed when the job
        must not go on."""
        now = time.monotonic()
        at = now - self.t0
        if not lost:
            self.history.append(Fault(at, step, "-", f"attempt failed with every role alive: {error}"))
            if error is not None and not is_transient(error):
                raise self.fail(f"step {step + 1} failed and no role was lost: {error}")
            if self._retried_step == step:
                raise self.fail(f"step {step + 1} failed twice with every role alive: {error}")
            self._retried_step = step
            return 0.0
        for role, how in sorted(lost.items(), key=lambda kv: (kv[0].kind, kv[0].index)):
            self.history.append(Fault(at, step, role.name, how))
        again = sorted(r.name for r in lost if r in self._since_step)
        if again:
            raise self.fail(
                f"{', '.join(again)} failed again before the job completed a step since its replacement "
                "(a bad configuration or a data error?); not replacing it again"
            )
        if self.restarts + len(lost) > self.max_restarts:
            raise self.fail(
                f"{self.restarts + len(lost)} role replacements would exceed runconfig.max_role_restarts "
                f"({self.max_restarts})"
            )
        backoff = 0.0
        for role in lost:
            recent = [
                (t, s)
                for t, s in self._recent[role]
                if now - t < _BACKOFF_WINDOW_S and self._steps - s < _PROVEN_STEPS
            ]
            if recent:  # replaced before, lately: wait 0.5 s, 1 s, 2 s, ... (at most 30 s)
                backoff = max(backoff, min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** (len(recent) - 1)))
            self._recent[role] = [*recent, (now, self._steps)]
            self.by_kind[role.kind] += 1
        self.restarts += len(lost)
        self._since_step |= set(lost)
        return backoff

    def step_completed(self) -> None:
        """A step has completed: every replacement so far has proven itself."""
        self._steps += 1
        self._since_step.clear()
        self._retried_step = None


class Recovery:
    """Steps 1 to 4 above, for one run."""

    def __init__(
        self,
        roles: RolePlane,
        budget: RestartBudget,
        log: logging.Logger,
        emit: EventSink,
        cancelled: threading.Event,
        wait_ready: Callable[[], dict[str, list[str]]],
        snapshot: Callable[[int], Path],
        elastic: ElasticWorkers,
    ) -> None:
        """``snapshot(step)``: the runner takes a recovery snapshot of ``step`` (every shard at it) and makes
        it the run's newest recovery point; returns its directory. ``wait_ready``: every process's address by
        process index (``RolePlane.placed``). ``elastic``: starts lost roles again, and keeps the job's worker
        count (fewer where a worker finds no room: training/elastic.py)."""
        self.roles, self.budget, self.log = roles, budget, log
        self.backend = roles.backend
        self.emit, self.cancelled, self.wait_ready, self.snapshot = emit, cancelled, wait_ready, snapshot
        self.elastic = elastic
        self.probe_s = min(PROBE_TIMEOUT_S, roles.timeout_s)
        self.hung_s = min(roles.heartbeats.timeout_s, roles.timeout_s)  # silent this long: hung

    def recover(
        self, fault: RoleFault, at: int, done: int, applying: int | None, point: tuple[int, Path | None]
    ) -> int:
        """Recover from ``fault`` at step ``at`` (``done``: steps the run has committed; ``applying``: the
        step whose update was being applied, if any; ``point``: the recovery point as (step, directory or
        None for the seed's initial state)). Faults during the recovery start it over. Returns the step
        every shard holds now: ``at``, ``applying + 1`` where that update had landed everywhere, or the
        recovery point's (then the runner replays up to ``done``). Raises JobFailed where the job
        cannot go on."""
        error: RoleFault = fault
        while True:
            if self.cancelled.is_set():
                raise JobCancelled("cancelled")
            try:
                return self._once(error, at, done, applying, point)
            except RoleFault as again:
                error = again

    def _lost(self, since: float) -> dict[RoleSpec, str]:
        """Roles the backend reports dead, and hung roles (the restart kills them), each with how it was
        lost. ``since``: when the fault was found (monotonic).

        A role the heartbeats already found unresponsive is hung, with no probe; one that answered a
        heartbeat since ``since`` is alive; the others are probed, with the heartbeat timeout as the
        deadline: an answer from before the fault proves nothing, as a role killed a moment ago answered
        one just before."""
        dead = self.backend.dead()
        # a worker started again at a step boundary has no address yet: only its exit can tell it lost
        alive = [r for r in self.roles.processes() if r not in dead and self.roles.address_of(r)]
        beats = self.roles.heartbeats
        silent = beats.unresponsive()
        hung = {r: Heartbeats.message(r, silent[r]) for r in alive if r in silent}
        unknown = [r for r in alive if r not in hung and not beats.answered_since(r, since)]
        replies = self.roles.probe(unknown, self.hung_s) if unknown else {}
        how = f"did not answer a health check within {self.hung_s:g}s {HUNG}"
        hung |= {r: f"{r.name} {how}" for r in unknown if replies[r] is None}
        # A role killed a moment ago refuses the probe before the backend sees it exit (a SIGKILLed process
        # can take a while to be gone, under load over a second): look again for EXIT_GRACE_S from when it
        # fell silent (its last heartbeat; the probe, where none is known), so that it is reported dead,
        # with how it died, not hung. A role silent for the heartbeat timeout has had that grace already,
        # unless its server refuses calls: then it is exiting (stopping on SIGTERM takes it a few seconds
        # under load), not hung, and gets EXIT_GRACE_S from now.
        exiting = self.roles.refusing(list(hung), REFUSED_S) if hung else set()
        now = time.monotonic()
        deadline = max(
            (
                now + EXIT_GRACE_S if r in exiting else now - (beats.silence(r) or 0.0) + EXIT_GRACE_S
                for r in hung
            ),
            default=now,
        )
        while hung:
            dead |= {r: how for r, how in self.backend.dead().items() if r in hung}
            hung = {r: how for r, how in hung.items() if r not in dead}
            if not hung or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return {**dead, **{r: f"{how}; killed" for r, how in hung.items()}}

    def _once(
        self, error: RoleFault, at: int, done: int, applying: int | None, point: tuple[int, Path | None]
    ) -> int:
        t0 = time.monotonic()
        lost = self._lost(since=t0)
        backoff = self.budget.admit(lost, at, error)  # raises JobFailed past the budget
        if lost:  # a role being replaced answers nothing: no verdict until every role is configured again
            self.roles.heartbeats.pause()
        for role, how in lost.items():
            self.log.warning("step %d: %s; replacing it", at + 1, how)
            self.emit(
                RestartEvent(
                    role=role.name,
                    role_kind=role.kind,
                    step=at + 1,
                    reason=how,
                    restarts=self.budget.restarts,
                    max_role_restarts=self.budget.max_restarts,
                    fault="hung" if HUNG in how else "died",
                    host=self._host_of(role),
                )
            )
        if not lost:
            self.log.warning("step %d failed with every role alive (%s); running it again", at + 1, error)
            self.emit(RetryEvent(step=at + 1, reason=str(error)))
        if backoff and self.cancelled.wait(backoff):
            raise JobCancelled("cancelled")
        addresses = self.roles.addresses
        keeps, rebuild, failed_over = self._shards_after(lost)
        left_out = self.elastic.replace(list(lost), at, self.budget.fail) if lost else []
        replaced = sorted(r.name for r in lost if r not in left_out)
        done_here = (
            [f"replaced {', '.join(replaced)}"] if replaced else [] if lost else ["ran the step again"]
        )
        if left_out:
            done_here.append(f"went on without {', '.join(r.name for r in left_out)} (no capacity)")
        done_here += [f"memoryx-{i} failed over to its replica" for i in sorted(failed_over)]
        if lost:
            try:
                addresses = self.wait_ready()
            except (BackendError, JobFailed) as e:
                if self.cancelled.is_set():
                    raise JobCancelled("cancelled") from e
                raise self.budget.fail(f"a replacement role failed to start: {e}") from e
            self.elastic.settle(addresses)
        generation = self.roles.next_generation()
        now_at: int | None = None
        if keeps:
            self._configure(addresses, None, lost, keep_state=True, later=rebuild)
            new = frozenset(self.roles.serving_process(REPLICA, i) for i in rebuild)
            steps = set(self.roles.shard_steps(self.probe_s, but=new))
            if steps == {at} or (applying == at and steps == {at + 1}):
                now_at = steps.pop()
            else:
                self.log.warning("MemoryX shards disagree after the fault (steps %s): rolling back", steps)
        if now_at is None:  # a shard's state is lost: every shard goes back to the recovery point
            now_at, path = point
            self._configure(addresses, str(path) if path else None, lost)
            done_here.append(f"rolled every MemoryX shard back to step {now_at}")
        elif rebuild:
            self._rebuild(rebuild, now_at, point)
            done_here.append(f"rebuilt the replica of {', '.join(f'memoryx-{i}' for i in sorted(rebuild))}")
        took = time.monotonic() - t0
        self.log.info(
            "recovered in %.1fs: generation %d, %d restarts so far, replaying %d steps from step %d",
            took,
            generation,
            self.budget.restarts,
            max(0, done - now_at),
            now_at,
        )
        self.emit(
            RecoveredEvent(
                step=now_at,
                replay_steps=max(0, done - now_at),
                recovery_s=took,
                generation=generation,
                restarts=self.budget.restarts,
                addresses=self.roles.serving(),
                action="; ".join(done_here),
            )
        )
        self.elastic.announce(now_at + 1)
        return now_at

    def _host_of(self, role: RoleSpec) -> str:
        """The host ``role``'s process reported in its ready file, where the backend keeps them in a run
        directory (local, Slurm); "" where it does not (Kubernetes: the pod's node is in its events)."""
        run_dir = getattr(self.backend, "run_dir", None)
        if run_dir is None:
            return ""
        try:
            return str(json.loads(ready_file(run_dir, role).read_text()).get("host", ""))
        except (OSError, ValueError):
            return ""

    def _shards_after(self, lost: dict[RoleSpec, str]) -> tuple[bool, frozenset[int], frozenset[int]]:
        """What the loss of ``lost`` leaves of MemoryX: (whether every shard's state survives, the shards
        whose replica must be built again, the shards that failed over). A shard that lost its serving
        process but not its replica fails over to the replica (``RolePlane.promoted``), whose state is the
        shard's, bit for bit; the process that replaces the lost one becomes the new replica. A shard that
        lost both, or that has no replica, has lost its state."""
        counts = self.roles.plan.counts()
        serving = self.roles.serving_process
        primary = {i for i in range(counts["memoryx"]) if serving("memoryx", i) in lost}
        replica = {i for i in range(counts[REPLICA]) if serving(REPLICA, i) in lost}
        if not counts[REPLICA]:
            return not primary, frozenset(), frozenset()
        if primary & replica:
            return False, frozenset(), frozenset()
        for i in sorted(primary):
            self.log.warning("memoryx-%d fails over to its replica (%s)", i, serving(REPLICA, i).name)
            self.roles.promoted ^= {i}
        return True, frozenset(primary | replica), frozenset(primary)

    def _rebuild(self, shards: frozenset[int], step: int, point: tuple[int, Path | None]) -> None:
        """Give each of ``shards``' new replicas the state every shard is at, ``step``: from the recovery
        point if it is of that step, else from a recovery snapshot taken now (the shards write it; it is the
        newest recovery point from then on)."""
        at, path = point
        t0 = time.monotonic()
        if path is None or at != step:
            path = self.snapshot(step)
        t1 = time.monotonic()
        for i in sorted(shards):
            self.roles.configure_replica(i, str(path))
        self.log.info("replicas rebuilt from step %d: snapshot %.2fs, loading %.2fs", step, t1 - t0,
                      time.monotonic() - t1)  # fmt: skip

    def _configure(
        self,
        addresses: dict[str, list[str]],
        resume_dir: str | None,
        lost: dict[RoleSpec, str],
        keep_state: bool = False,
        later: frozenset[int] = frozenset(),
    ) -> None:
        """Configure every role again; a role refusing its configuration for a reason a retry cannot cure
        (its data is gone, a file is unreadable) fails the job rather than being replaced in a loop."""
        try:
            self.roles.configure(addresses, resume_dir, keep_state, later)
        except RoleFault as e:
            if is_transient(e):
                raise
            replaced = ", ".join(sorted(r.name for r in lost)) or "no role"
            raise self.budget.fail(
                f"the job could not be configured again after replacing {replaced}: {e}"
            ) from e

"""Elastic workers: a job whose lost worker cannot be started again for want of capacity goes on with fewer,
the global batch unchanged, and grows back once capacity returns (Cerebras' AutoRestart with
``min_num_csx``).

Shrinking, in recovery (training/recovery.py): the lost roles are started again through the backend. Those it
has no room for (``NoCapacityError``) are tried again, after 1 s, 2 s, 4 s, ..., for up to
``runconfig.elastic_wait_s``. Then, if only workers are left out and at least ``runconfig.min_num_csx`` would
remain, the backend retires them (``Backend.retire``) and the job is planned again with the workers it has
(``make_plan(num_csx=N')``): worker slots 0..N'-1 served by the remaining worker processes in index order
(``RolePlane.workers_at``), the same MemoryX shards, which keep their state, and the smaller SwarmX tree (the
job's other SwarmX processes idle). The interrupted step runs again, its global batch split N' ways.
Otherwise the job fails, saying what had no room and why it could not go on without it.

Growing, at step boundaries (``at_boundary``, before each step): the retired workers are started again,
at most once per backoff interval (1 s doubling to 30 s), and never waited on: a started worker comes up
while the steps go on (``wait_ready`` in the background). Once it listens, at the next boundary with no step
sent ahead, every role is configured again under a new generation with the plan of the workers the job has,
MemoryX keeping its state. A recovery meanwhile (another fault) takes the started workers in with it.

Each change of the worker count is a ``WorkersEvent`` (from, to, why, the first step with the new count),
and each step's record carries its worker count. The numbers: a step's gradient is the sum of the workers'
shares, each taken with the global batch's loss denominator, and dropout keyed by the global sample, so a
different split changes only the order of float32 additions: results equal a fixed-N run to rounding,
not bit for bit. A job whose worker count never changes does exactly what it did before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from weightstream.backends.base import BackendError, NoCapacityError, RoleSpec
from weightstream.numerics import ModelDef
from weightstream.params import Params
from weightstream.plan import make_plan
from weightstream.training.errors import JobCancelled, JobFailed
from weightstream.training.events import EventSink, WorkersEvent
from weightstream.training.roles import RolePlane

__all__ = ["ElasticWorkers"]

# how soon a role with no room is tried again, doubling each time up to the last: soon enough that a job
# waiting for capacity notices it within seconds, rarely enough not to press a scheduler with queries
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0

Addresses = dict[str, list[str]]


def _names(roles: list[RoleSpec]) -> str:
    return ", ".join(r.name for r in roles)


class ElasticWorkers:
    """The job's worker count, between ``runconfig.min_num_csx`` and ``num_csx``, for one run."""

    def __init__(
        self,
        roles: RolePlane,
        params: Params,
        model: ModelDef,
        log: logging.Logger,
        emit: EventSink,
        cancelled: threading.Event,
        wait_ready: Callable[[], Addresses],
    ) -> None:
        """``wait_ready``: every process's address once all of the job's (retired ones aside) listen, by
        process index (``RolePlane.placed``); raises JobFailed when one dies or none comes in time."""
        rc = params.runconfig
        self.roles, self.backend, self.params, self.model = roles, roles.backend, params, model
        self.num_csx, self.wait_s = rc.num_csx, rc.elastic_wait_s
        self.min_workers = rc.min_num_csx or rc.num_csx
        self.explicit_min = rc.min_num_csx is not None
        self.log, self.emit, self.cancelled, self.wait_ready = log, emit, cancelled, wait_ready
        # workers started again at a boundary, and the wait for them to listen
        self._joining: tuple[list[RoleSpec], Future[Addresses]] | None = None
        self._next_try, self._pause = 0.0, RETRY_FIRST_S  # when retired workers are tried next, and after
        self._left_out = ""  # why the workers retired last were, for the event that announces it
        self._change: tuple[int, list[str]] | None = None  # (workers before, why): not yet announced

    # -- recovery ------------------------------------------------------------------------------------------
    def replace(self, lost: list[RoleSpec], step: int, fail: Callable[[str], JobFailed]) -> list[RoleSpec]:
        """Start the ``lost`` roles again (step ``step``, 0-based, was interrupted), waiting up to
        ``elastic_wait_s`` for room where the backend has none. Returns the workers the job goes on without
        (retired); raises ``fail(why)`` where it cannot go on: a role other than a worker has no room, fewer
        than ``min_num_csx`` workers would be left, or a role failed to start for another reason."""
        unplaced, why = self._restart(lost, fail)
        if unplaced:
            self.log.warning(
                "step %d: %s; trying again for up to %gs (runconfig.elastic_wait_s)",
                step + 1,
                why,
                self.wait_s,
            )
        deadline, pause = time.monotonic() + self.wait_s, RETRY_FIRST_S
        while unplaced and (remaining := deadline - time.monotonic()) > 0:
            if self.cancelled.wait(min(pause, remaining)):
                raise JobCancelled("cancelled")
            pause = min(2 * pause, RETRY_MAX_S)
            unplaced, why = self._restart(unplaced, fail)
        if not unplaced:
            return []
        waited = f"no capacity to start {_names(unplaced)} again within {self.wait_s:g}s"
        if others := [r for r in unplaced if r.kind != "worker"]:
            raise fail(f"{waited} ({why}); the job can go on without workers only, not {_names(others)}")
        left = [
            i
            for i in range(self.num_csx)
            if i not in self.roles.retired and RoleSpec("worker", i) not in unplaced
        ]
        if len(left) < self.min_workers:
            floor = (
                f"runconfig.min_num_csx={self.min_workers}"
                if self.explicit_min
                else f"runconfig.min_num_csx (unset: num_csx={self.num_csx}; set it to go on with fewer)"
            )
            raise fail(
                f"{waited} ({why}); going on without {_names(unplaced)} would leave {len(left)} workers, "
                f"fewer than {floor}"
            )
        self.backend.retire(unplaced)
        self.roles.retired |= {r.index for r in unplaced}
        self._left_out = waited
        self._next_try, self._pause = time.monotonic() + RETRY_FIRST_S, RETRY_FIRST_S
        self.log.warning("step %d: %s; the job goes on with %d workers", step + 1, waited, len(left))
        return unplaced

    def _restart(self, roles: list[RoleSpec], fail: Callable[[str], JobFailed]) -> tuple[list[RoleSpec], str]:
        """Start ``roles`` again: (those the backend has no room for, its words)."""
        try:
            self.backend.restart(roles)
        except NoCapacityError as e:
            return e.roles, str(e)
        except BackendError as e:
            if self.cancelled.is_set():
                raise JobCancelled("cancelled") from e
            raise fail(f"a replacement role failed to start: {e}") from e
        return [], ""

    def settle(self, addresses: Addresses) -> None:
        """After recovery has started what it could and every process it has listens (``addresses``, by
        process index): train with those worker processes, planned again if their number changed. Workers
        started at a boundary are among them (recovery waited for them too)."""
        self._joining = None
        self._use(tuple(i for i, a in enumerate(addresses["worker"]) if a))

    def announce(self, step: int) -> None:
        """Emit the change of the worker count since the last announcement, if any: the job trains with the
        new count from step ``step`` (1-based) on."""
        change, self._change = self._change, None
        if change is None or change[0] == self.roles.plan.num_csx:
            return
        before, why = change
        now = self.roles.plan.num_csx
        (self.log.warning if now < before else self.log.info)(
            "workers %d -> %d from step %d: %s", before, now, step, "; ".join(why)
        )
        self.emit(WorkersEvent(step=step, from_workers=before, to_workers=now, reason="; ".join(why)))

    def _use(self, processes: tuple[int, ...]) -> None:
        """Serve the worker slots with ``processes`` from the next configuration on
        (``RolePlane.use_workers``), noting why the count changed for ``announce``."""
        before = self.roles.workers_at
        if processes == before:
            return
        gone = [RoleSpec("worker", i) for i in before if i not in processes]
        came = [RoleSpec("worker", i) for i in processes if i not in before]
        plan = make_plan(self.params, self.model, len(processes))
        self.roles.use_workers(plan, processes)
        change = self._change or (len(before), [])
        if gone:
            change[1].append(self._left_out or f"went on without {_names(gone)}")
        if came:
            change[1].append(f"capacity returned: {_names(came)} started again")
        self._change = change

    # -- step boundaries -----------------------------------------------------------------------------------
    @property
    def wants_boundary(self) -> bool:
        """Whether workers started again are ready to join: the next step boundary configures the job
        again, so no step should be sent ahead of it."""
        return self._joining is not None and self._joining[1].done()

    def at_boundary(self, done: int, sent_ahead: bool) -> None:
        """Before step ``done + 1`` (1-based), ``sent_ahead``: whether its RunStep is already out. Let workers
        that listen now join (not while a step is sent ahead: a new configuration would cancel it), or try
        to start the retired ones again when it is time; never waits for capacity or for a worker to
        come up. A configuration that fails raises RoleFault, which the runner recovers from."""
        if self._joining is not None:
            if self._joining[1].done() and not sent_ahead:
                self._join(done)
        elif self.roles.retired and time.monotonic() >= self._next_try:
            self._try_again()

    def _try_again(self) -> None:
        retired = [RoleSpec("worker", i) for i in sorted(self.roles.retired)]
        try:
            self.backend.restart(retired)
            unplaced: list[RoleSpec] = []
        except NoCapacityError as e:
            unplaced = e.roles
        except BackendError as e:
            self.log.warning("could not start %s again (%s); trying again later", _names(retired), e)
            self.backend.retire(retired)  # whatever it started of them: the job still goes on without
            unplaced = retired
        if unplaced:
            self._next_try = time.monotonic() + self._pause
            self._pause = min(2 * self._pause, RETRY_MAX_S)
        started = [r for r in retired if r not in unplaced]
        if started:
            self.roles.retired -= {r.index for r in started}
            self.log.info("started %s again: it joins at a step boundary once it listens", _names(started))
            self._joining = (started, self.roles.submit(self.wait_ready))

    def _join(self, done: int) -> None:
        assert self._joining is not None
        started, future = self._joining
        self._joining = None
        try:
            addresses = future.result()
        except JobFailed as e:
            if any(r in self.backend.dead() for r in started):
                return  # a started worker died: the next step finds it and recovery replaces it
            self.log.warning("%s not ready yet (%s); waiting on", _names(started), e)
            self._joining = (started, self.roles.submit(self.wait_ready))
            return
        self.roles.next_generation()
        self._use(tuple(i for i, a in enumerate(addresses["worker"]) if a))
        self.roles.configure(addresses, None, keep_state=True)
        self.announce(done + 1)

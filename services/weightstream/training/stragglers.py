"""Stragglers: the worker each step waited for, and a warning when one keeps being it.

A step ends when its slowest worker's RunStep does, so one slow worker (a slow link, a busy or throttled
host) slows the whole job. Each worker reports its time in the step, ``compute_s + wait_s`` of its
RunStep reply: its forward and backward, and its waits for weights and for its gradient pushes, so a slow
link shows as well as slow compute. Every step's record keeps the slowest worker and its time over the
median of the *other* workers' (with two workers the median of all would be their mean, which the slowest
could never reach twice).

A worker that is the slowest at ``STRAGGLER_RATIO`` or more, and ``STRAGGLER_MIN_LAG_S`` or more
behind, for ``STRAGGLER_STEPS`` committed steps running is a straggler: ``StragglerWatch`` says so once
for the stretch, and again only after the stretch has ended (a step below either bound, or another
worker the slowest) and a new one has lasted as long. The lag's floor keeps small steps quiet: at 0.15 s
a step on a busy host, two workers differ by 1.5x in 4 steps of 10 (measured, 10 emulated hosts on 2
cores), a few hundredths of a second that no user can act on.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence

from weightstream.training.events import StragglerEvent
from weightstream.training.records import StepRecord
from weightstream.training.roles import RolePlane

__all__ = [
    "STRAGGLER_MIN_LAG_S",
    "STRAGGLER_RATIO",
    "STRAGGLER_STEPS",
    "StragglerWatch",
    "host_named",
    "slowest_worker",
    "straggler_event",
]

STRAGGLER_RATIO = 1.5  # a worker this many times the others' median is holding the step back
# steps running before the warning: one slow step is noise (a page fault, a neighbour's burst), three is a
# pattern that a user can act on (the host, its link)
STRAGGLER_STEPS = 3
STRAGGLER_MIN_LAG_S = 0.1  # seconds behind the others' median, each step
_FLOOR_S = 1e-6  # the others' median below this counts as this: a ratio, never a division by zero
PROBE_S = 2.0  # a straggler's Health call, which names its host: it answers at once when up


def slowest_worker(times_s: Sequence[float]) -> tuple[int, float, float]:
    """(index of the slowest worker, its time over the median of the others' times, its time minus that
    median in seconds) from each worker's time in a step, in seconds; (-1, 1.0, 0.0) with fewer than two
    workers, where there is no one to lag."""
    if len(times_s) < 2:
        return -1, 1.0, 0.0
    i = max(range(len(times_s)), key=lambda j: times_s[j])
    others = statistics.median(t for j, t in enumerate(times_s) if j != i)
    ratio = (times_s[i] / max(others, _FLOOR_S)) if times_s[i] > 0 else 1.0
    return i, ratio, times_s[i] - others


def host_named(identity: str, address: str) -> str:
    """A worker's host as a user knows it: the host name that starts its identity (its Health reply's
    ``host``, "<host name>/<boot id>/..."), else the host part of its address ("host:port")."""
    return identity.split("/")[0] or address.rpartition(":")[0]


class StragglerWatch:
    """Follows the slowest worker of each committed step; ``observe`` returns a worker's index once when it
    has been at or above ``ratio`` and ``min_lag_s`` behind for ``steps`` steps running (a stretch), None
    otherwise."""

    def __init__(
        self,
        ratio: float = STRAGGLER_RATIO,
        steps: int = STRAGGLER_STEPS,
        min_lag_s: float = STRAGGLER_MIN_LAG_S,
    ) -> None:
        if ratio <= 1 or steps < 1:
            raise ValueError(f"a straggler is >1x the others for >=1 steps: got ratio {ratio}, steps {steps}")
        self.ratio, self.steps, self.min_lag_s = ratio, steps, min_lag_s
        self._worker = -1  # the worker of the current stretch, -1 when there is none
        self.run = 0  # steps of the current stretch so far
        self._warned = False
        self._workers = 0  # the worker count of the last record observed

    def observe(self, worker: int, ratio: float, lag_s: float) -> int | None:
        """One committed step's slowest worker (-1: none), its ratio and its lag (``slowest_worker``)."""
        if worker < 0 or ratio < self.ratio or lag_s < self.min_lag_s:
            self._worker, self.run, self._warned = -1, 0, False
            return None
        if worker != self._worker:  # another worker holds the step back: a new stretch
            self._worker, self.run, self._warned = worker, 0, False
        self.run += 1
        if self.run >= self.steps and not self._warned:
            self._warned = True
            return worker
        return None

    def observe_record(self, record: StepRecord) -> int | None:
        """``observe`` with a committed step's record: the worker slot of a new straggler, or None. A change
        of the worker count (``runconfig.min_num_csx``) ends a stretch: slot i may be another process now."""
        if record.workers != self._workers:
            self._worker, self.run, self._warned, self._workers = -1, 0, False, record.workers
        return self.observe(record.slowest_worker, record.slowest_worker_ratio, record.slowest_worker_lag_s)


def straggler_event(
    roles: RolePlane, record: StepRecord, slot: int, steps: int, log: logging.Logger
) -> StragglerEvent:
    """The event that says worker slot ``slot`` has held the steps back for ``steps`` steps up to
    ``record``'s, logged as a warning: it names the worker process serving the slot (with fewer workers
    than ``num_csx``, slot i is not always process i: ``RolePlane.workers_at``) and its host as the
    process names itself (its Health reply; its address's host where it does not answer)."""
    process = roles.serving_process("worker", slot)
    reply = roles.probe([process], PROBE_S)[process]
    host = host_named(reply.host if reply else "", roles.address_of(process))
    e = StragglerEvent(record.step, process.name, host, record.slowest_worker_ratio, steps)
    log.warning("step %d: %s on %s is a straggler: %.2fx the other workers' median time for %d steps "
                "running", e.step, e.worker, e.host, e.ratio, e.steps)  # fmt: skip
    return e

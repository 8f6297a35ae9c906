"""Heartbeats: the coordinator finds a role that stops answering (SIGSTOPped, partitioned, its host frozen)
within seconds, where a call waiting on it would wait out its whole deadline (``runconfig.rpc_timeout_s``).

Once the roles are configured, a daemon thread sends ``Control.Health`` to every role every ``interval_s``
(0.5 s), each call with the heartbeat timeout as its deadline, at most one in flight per role: a role slow
to answer is not sent a queue of them. The monitor records when each role last answered. A role that has
not answered for ``timeout_s`` (``runconfig.heartbeat_timeout_s``) while a heartbeat has waited on it for
at least one interval is *unresponsive*; ``RolePlane.check_roles`` fails the step naming it, and recovery
kills and replaces it without probing it again.

The verdict pauses while the coordinator itself is restarting or configuring roles (a role being replaced
answers nothing, and a role building its logic may be slow to), and every role of a new configuration
starts as if it had just answered. The heartbeat that must wait at least one interval keeps a
coordinator that was itself stalled (its monitor thread not running) from blaming the roles for the
beats it never sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from weightstream.backends.base import RoleSpec

__all__ = ["HEARTBEAT_INTERVAL_S", "Heartbeats", "Ping"]

HEARTBEAT_INTERVAL_S = 0.5  # one tiny call per role this often: ~2 calls a second per role

# One Health call to a role with this deadline, in seconds; returns once it has answered, raises otherwise
Ping = Callable[[float], object]


@dataclass
class _Watched:
    ping: Ping
    last_answer: float  # clock time of the role's last answer (or of its configuration)
    asked: float | None = None  # when the first heartbeat since that answer was sent
    in_flight: bool = False


class Heartbeats:
    """Watches the roles of the current configuration. ``clock``: seconds, monotonic (tests pass a fake)."""

    def __init__(
        self,
        timeout_s: float,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0 or interval_s <= 0:
            raise ValueError(f"heartbeat timeout {timeout_s}s and interval {interval_s}s must be > 0")
        self.timeout_s, self.interval_s, self.clock = timeout_s, interval_s, clock
        self._lock = threading.Lock()
        self._roles: dict[RoleSpec, _Watched] = {}  # empty while paused
        self._epoch = 0  # bumped by every watch and pause: a late answer of an earlier one is dropped
        # how close the roles came to the timeout, for run.log: (seconds, role) of the slowest answer, and
        # of the longest a role went without answering (the interval, at best)
        self.slowest: tuple[float, str] = (0.0, "")
        self.longest_silence: tuple[float, str] = (0.0, "")
        self.answers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    # -- what the coordinator tells it -------------------------------------------------------------------
    def watch(self, pings: dict[RoleSpec, Ping]) -> None:
        """Watch these roles from now on (a new configuration), each as if it had just answered (its
        configuration has)."""
        now = self.clock()
        with self._lock:
            self._epoch += 1
            self._roles = {role: _Watched(ping, now) for role, ping in pings.items()}

    def start(self) -> None:
        """Send heartbeats from a daemon thread every ``interval_s`` from now on (a second call does
        nothing). Until then ``beat`` sends them on the caller's thread, one after another (tests)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            # a thread per role (one call in flight each), so that a hung role's call, waiting out its
            # deadline, holds up no other role's; twice that while a new configuration's calls begin
            # before the previous one's, cancelled as its channels close, have ended
            self._pool = ThreadPoolExecutor(max(2, 2 * len(self._roles)), thread_name_prefix="heartbeat")
            self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Stop judging (and sending) until the next ``watch``: the coordinator is replacing or
        configuring roles."""
        with self._lock:
            self._epoch += 1
            self._roles = {}

    def close(self) -> None:
        self.pause()
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the verdicts --------------------------------------------------------------------------------------
    def unresponsive(self, kind: str | None = None) -> dict[RoleSpec, float]:
        """The roles (of ``kind``, or every kind) that have not answered for the timeout, each with the
        seconds since its last answer; empty while paused."""
        now = self.clock()
        with self._lock:
            return {
                role: now - w.last_answer
                for role, w in self._roles.items()
                if (kind is None or role.kind == kind)
                and now - w.last_answer >= self.timeout_s
                and w.asked is not None
                and now - w.asked >= min(self.interval_s, self.timeout_s)
            }

    def silence(self, role: RoleSpec) -> float | None:
        """Seconds since ``role`` last answered (or was configured); None while paused."""
        with self._lock:
            w = self._roles.get(role)
            return None if w is None else self.clock() - w.last_answer

    def answered_since(self, role: RoleSpec, t: float) -> bool:
        """Whether ``role`` answered a heartbeat (or its configuration) at clock time ``t`` or later."""
        with self._lock:
            w = self._roles.get(role)
            return w is not None and w.last_answer >= t

    @staticmethod
    def message(role: RoleSpec, silent_s: float) -> str:
        """How a hung role is named in a fault, an event and run.log."""
        return f"{role.name} did not answer heartbeats for {silent_s:.1f}s (hung)"

    # -- sending -------------------------------------------------------------------------------------------
    def beat(self) -> None:
        """One round: a heartbeat to every watched role with none in flight. The thread calls it every
        ``interval_s``; tests call it themselves."""
        now = self.clock()
        with self._lock:
            epoch, pool = self._epoch, self._pool
            due = [(role, w.ping) for role, w in self._roles.items() if not w.in_flight]
            for role, _ in due:
                w = self._roles[role]
                w.in_flight = True
                if w.asked is None:
                    w.asked = now
        for role, ping in due:
            if pool is None:  # not started: on this thread
                self._send(epoch, role, ping)
            else:
                try:
                    pool.submit(self._send, epoch, role, ping)
                except RuntimeError:  # closed meanwhile
                    return

    def _send(self, epoch: int, role: RoleSpec, ping: Ping) -> None:
        sent = self.clock()
        try:
            ping(self.timeout_s)  # an answer later than the timeout is of no use: the verdict is in
            ok = True
        except Exception:  # DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED (closed channel): no answer
            ok = False
        now = self.clock()
        with self._lock:
            w = self._roles.get(role)
            if epoch != self._epoch or w is None:
                return  # an answer of an earlier configuration says nothing of this one's role
            w.in_flight = False
            if ok:
                if now - w.last_answer > self.longest_silence[0]:
                    self.longest_silence = (now - w.last_answer, role.name)
                if now - sent > self.slowest[0]:
                    self.slowest = (now - sent, role.name)
                w.last_answer, w.asked = now, None
                self.answers += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

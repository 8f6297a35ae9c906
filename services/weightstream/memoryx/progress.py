"""Where a MemoryX shard is in the step protocol, and the one lock every piece of it shares.

``ShardProgress`` holds what the pieces (serving, gradients and update, checkpoints, fencing) decide by:
the step the weights are at, the generation calls are accepted from, the update being applied (and the
tensors it has finished, which may be served before the rest), and whether the shard is closed. A piece
reads or changes them only while it holds the lock (``with progress:``).

Every wait of the shard goes through here: under the lock, up to the shard's timeout, and failing with
ShardClosedError as soon as the shard closes (a call left waiting out its timeout would hold a stopping
process alive). ``waiting`` counts the calls blocked in a wait right now and ``wait_for_waiters`` waits
for that count, so a test (or an operator's probe) knows a call is blocked without guessing by a sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from weightstream.memoryx.errors import ShardClosedError
from weightstream.transport.fencing import check_generation

__all__ = ["ShardProgress"]


class ShardProgress:
    def __init__(self, timeout_s: float, step: int = 0, generation: int = 0) -> None:
        """``timeout_s``: how long any call waits here (for gradients, weights, an update) before it fails;
        ``step``: the updates the weights have had (a checkpoint's); ``generation``: the calls accepted."""
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._waiters_changed = threading.Condition(lock)  # its own: waking tests wakes no call
        self.timeout_s = timeout_s
        self.step = step
        self.generation = generation
        # While an update runs (outside the lock, tensor by tensor): its step, and the tensors done so far.
        self.updating: int | None = None
        self.fresh: set[str] = set()
        self.closed = False
        self.waiting = 0  # calls blocked in a wait now

    def __enter__(self) -> ShardProgress:
        self._cond.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cond.release()

    def notify(self) -> None:
        """Wake every waiting call to look again (under the lock): something it may wait for changed."""
        self._cond.notify_all()

    def check(self, generation: int, what: str) -> None:
        """Refuse ``what`` (StaleGenerationError) unless it is of the generation accepted now."""
        check_generation(generation, self.generation, what)

    # -- waiting -------------------------------------------------------------------------------------------
    def wait(self, ready: Callable[[], bool]) -> bool:
        """Wait (under the lock) until ``ready()``, up to the timeout: whether it is. Raises
        ShardClosedError if the shard is closed, before or meanwhile."""
        done = self._blocked(lambda: self.closed or ready(), self.timeout_s)
        if self.closed:
            raise ShardClosedError("this MemoryX shard was closed (its role is stopping or reconfigured)")
        return done

    def idle(self) -> None:
        """Wait (under the lock) until no update is being applied; TimeoutError if one outlasts the
        timeout."""
        if not self.wait(lambda: self.updating is None):
            raise TimeoutError(f"the update of step {self.updating} still running after {self.timeout_s}s")

    def _blocked(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """``wait_for(ready)``, counted in ``waiting`` while it blocks."""
        if ready():
            return True
        self.waiting += 1
        self._waiters_changed.notify_all()
        try:
            return self._cond.wait_for(ready, timeout=timeout_s)
        finally:
            self.waiting -= 1

    def wait_for_waiters(self, count: int, timeout_s: float) -> bool:
        """Wait until at least ``count`` calls are blocked in this shard's waits (each has taken the lock,
        found what it waits for not there, and let the lock go while it waits), up to ``timeout_s``:
        whether they are."""
        with self._waiters_changed:
            return self._waiters_changed.wait_for(lambda: self.waiting >= count, timeout=timeout_s)

    # -- the update in flight (under the lock) ---------------------------------------------------------------
    def begin_update(self, step: int) -> None:
        self.updating, self.fresh = step, set()

    def updated(self, name: str) -> None:
        """Tensor ``name`` has its update of the step in flight: readers of the next step may have it."""
        self.fresh.add(name)
        self._cond.notify_all()

    def end_update(self) -> None:
        self.updating, self.fresh = None, set()
        self._cond.notify_all()

    def close(self) -> None:
        """Refuse every call from now on and wake those waiting (they raise ShardClosedError); then wait,
        up to the timeout, until an update being applied is done (its store is never freed under it)."""
        self.closed = True
        self._cond.notify_all()
        self._blocked(lambda: self.updating is None, self.timeout_s)

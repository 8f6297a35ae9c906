"""A step's traffic in units: weights streamed in ahead of their use and let go right after it, gradients
pushed up behind backward with bounded back-pressure.

A unit's weights are the largest thing a worker holds, so who holds them, and until when, is decided here
and nowhere else: ``UnitStream`` lends out one unit at a time (``LentUnit``) and takes it back when the
next is asked for, while at most one more is on its way. Code that computes with a unit reads
``unit.params`` and keeps no reference of its own, so the weights a worker holds stay bounded however
deep the model is. No gRPC here: fetches and pushes are callables that return futures.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import TypeVar

import numpy as np

__all__ = ["PUSHES_IN_FLIGHT", "GradientPushes", "LentUnit", "Tensors", "UnitStream", "WaitClock"]

Tensors = dict[str, np.ndarray]
Fetch = Callable[[int], Future[Tensors]]  # unit index -> its weights, on their way
Push = Callable[[int, Tensors], Future[None]]  # (unit index, its gradients) -> their push, under way
T = TypeVar("T")

# Gradients of at most this many units are on their way up while backward goes on: one is enough to
# overlap the reduction of unit l with the backward of unit l-1, and keeps the worker's memory flat.
PUSHES_IN_FLIGHT = 1


class WaitClock:
    """Seconds a step spent blocked on its units: waiting for weights to arrive or for gradients to leave.
    Only the wait itself is counted, not the computing it overlaps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def result(self, future: Future[T]) -> T:
        """``future``'s result, the time spent waiting for it counted."""
        t0 = time.perf_counter()
        out = future.result()
        self.seconds += time.perf_counter() - t0
        return out

    def all_done(self, futures: Iterable[Future[None]]) -> None:
        """Wait for every one of ``futures``, counted as one wait."""
        t0 = time.perf_counter()
        for f in futures:
            f.result()
        self.seconds += time.perf_counter() - t0


class LentUnit:
    """One unit's weights, lent by a ``UnitStream`` until it hands out the next unit. Read ``params``
    where they are used and keep no reference of your own: the stream's taking them back is what lets
    them go."""

    __slots__ = ("_params", "index")

    def __init__(self, index: int, params: Tensors) -> None:
        self.index = index
        self._params: Tensors | None = params

    @property
    def params(self) -> Tensors:
        if self._params is None:
            raise RuntimeError(
                f"unit {self.index}'s weights were already taken back by their stream: a unit is used "
                "only until the next one is asked for"
            )
        return self._params

    def _take_back(self) -> Tensors | None:
        params, self._params = self._params, None
        return params


class UnitStream:
    """The units of one pass, lent out one at a time in ``order``, each fetched while the one before it
    computes.

    - Fetch-ahead: ``opening`` units are asked for when the stream is made; after that, lending out a
      unit asks for the next one if none is here or on its way. So, ``ready`` units aside, at most two
      are here or coming: the one lent out and the next.
    - Lifetimes: the unit lent out is taken back as soon as the caller asks for the next (before that one
      is waited for and the one after it asked for: never three at once), when the pass ends, or on
      ``close``. The last ``keep`` units of the pass are set aside for ``reverse`` instead of let go.
    - ``check_open`` runs before each wait for a fetched unit: a closed worker gives up there rather than
      compute on. Units that were already here (``ready``) are lent out without waiting.

    A context manager: leaving it (an error mid-pass included) lets go of every unit it holds, the ones
    on their way too (cancelled if not yet started, dropped when they arrive otherwise)."""

    def __init__(
        self,
        fetch: Fetch,
        order: Sequence[int],
        clock: WaitClock,
        check_open: Callable[[], None],
        *,
        ready: Iterable[Tensors] = (),
        opening: int = 1,
        keep: int = 0,
    ) -> None:
        """``ready``: the weights of the first units of ``order``, already here; ``opening``: how many units
        after them to ask for at once; ``keep``: how many of the last units to set aside for ``reverse``."""
        self._fetch, self._order, self._clock, self._check_open = fetch, list(order), clock, check_open
        self._queue: deque[Tensors | Future[Tensors]] = deque(ready)  # in order: here, or on the way
        self._asked = len(self._queue)  # units of ``order`` here or asked for so far
        self._lent: LentUnit | None = None
        self._handed_out = 0  # units of ``order`` lent out so far
        self._keep_from = len(self._order) - keep  # position in ``order`` of the first unit to keep
        self._kept: list[Tensors] = []
        for _ in range(opening):
            self._ask()

    def __iter__(self) -> Iterator[LentUnit]:
        return self

    def __next__(self) -> LentUnit:
        self._take_back()
        if not self._queue:
            raise StopIteration
        if isinstance(self._queue[0], Future):  # to be waited for, unless the worker was closed
            self._check_open()
        entry = self._queue.popleft()
        params = self._clock.result(entry) if isinstance(entry, Future) else entry
        if not self._queue:
            self._ask()
        self._lent = LentUnit(self._order[self._handed_out], params)
        self._handed_out += 1
        return self._lent

    def reverse(self, fetch: Fetch) -> UnitStream:
        """The same units in reverse order (backward after forward), once this pass is over: the kept ones
        first, lent out without a fetch, then the rest through ``fetch``, the first of which is asked for
        now so that it arrives while the kept ones compute."""
        if self._handed_out < len(self._order) or self._lent is not None:
            raise RuntimeError(
                f"reverse of a pass that lent out {self._handed_out} of its {len(self._order)} units: "
                "a pass reverses only once it is over"
            )
        kept, self._kept = self._kept, []  # handed over: this stream must not hold them on
        kept.reverse()
        order = list(reversed(self._order))
        return UnitStream(fetch, order, self._clock, self._check_open, ready=kept, opening=1)

    def close(self) -> None:
        """Let go of every unit: the one lent out, those set aside, and those here or on their way."""
        lent, self._lent = self._lent, None
        if lent is not None:
            lent._take_back()
        self._kept.clear()
        while self._queue:
            entry = self._queue.popleft()
            if isinstance(entry, Future):
                entry.cancel()
        self._asked = len(self._order)  # nothing more is asked for

    def __enter__(self) -> UnitStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self) -> None:
        if self._asked < len(self._order):
            self._queue.append(self._fetch(self._order[self._asked]))
            self._asked += 1

    def _take_back(self) -> None:
        """The unit lent out is over: let go of it, or set it aside for the reverse pass."""
        lent, self._lent = self._lent, None
        if lent is None:
            return
        params = lent._take_back()
        if params is not None and self._handed_out > self._keep_from:  # lent unit's position >= keep_from
            self._kept.append(params)


class GradientPushes:
    """Gradients on their way up, at most ``in_flight`` at once: a push waits (counted on ``clock``) for
    the oldest one to be done, so gradients never pile up in the worker's memory."""

    def __init__(self, push: Push, clock: WaitClock, in_flight: int = PUSHES_IN_FLIGHT) -> None:
        self._push, self._clock, self._in_flight = push, clock, in_flight
        self._pending: deque[Future[None]] = deque()

    def push(self, unit: int, grads: Tensors) -> None:
        """Send ``grads`` of unit ``unit`` up; returns once it is under way (the oldest push done first if
        ``in_flight`` are already)."""
        if len(self._pending) >= self._in_flight:
            self._clock.result(self._pending.popleft())
        self._pending.append(self._push(unit, grads))

    def drain(self) -> None:
        """Wait until every gradient has gone up."""
        self._clock.all_done(self._pending)
        self._pending.clear()

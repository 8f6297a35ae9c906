"""The unit stream alone: which units are asked for when, how many are alive at once, when each is let go.

``FakeFetch`` serves units as futures and counts the ones alive with weakref finalizers (as
``test_engine.py``'s ``FakeUnits`` does), so a reference the stream holds on shows up as a live unit.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future

import numpy as np
import pytest

import weightstream.worker.units as units_module
from weightstream.worker.units import GradientPushes, Tensors, UnitStream, WaitClock

N = 6


class Closed(Exception):
    pass


class FakeFetch:
    """A fetch whose units arrive at once, except the calls numbered in ``never_arrive`` (0 is the first):
    their futures stay pending, as a fetch not yet started.

    ``asked``: unit indices in the order asked for; ``freed``: in the order their weights were let go;
    ``max_live``: the most units asked for whose weights were not freed yet."""

    def __init__(self, never_arrive: frozenset[int] = frozenset()) -> None:
        self.never_arrive = never_arrive
        self.asked: list[int] = []
        self.freed: list[int] = []
        self.never_arrived: list[Future[Tensors]] = []  # a future holds its result: only these are kept
        self.max_live = 0
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, unit: int) -> Future[Tensors]:
        future: Future[Tensors] = Future()
        if len(self.asked) in self.never_arrive:
            self.never_arrived.append(future)
        else:
            future.set_result(self.weights(unit))
        self.asked.append(unit)
        return future

    def weights(self, unit: int) -> Tensors:
        params = {"w": np.full(4, unit, np.float32)}
        with self._lock:
            self._live.add(unit)
            self.max_live = max(self.max_live, len(self._live))
        weakref.finalize(params["w"], self._free, unit)
        return params

    def _free(self, unit: int) -> None:
        with self._lock:
            self._live.discard(unit)
            self.freed.append(unit)

    @property
    def live(self) -> int:
        return len(self._live)


def stream(fetch: FakeFetch, opening: int = 1, keep: int = 0) -> UnitStream:
    """Units 0..N-1, never closed from outside, on a clock of their own."""
    return UnitStream(fetch, range(N), WaitClock(), lambda: None, opening=opening, keep=keep)


@pytest.fixture
def ticking_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``perf_counter`` advances by one on every reading: each timed wait counts exactly one second."""
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(units_module.time, "perf_counter", lambda: float(next(ticks)))


@pytest.mark.parametrize("opening", [1, 2])
def test_each_unit_is_asked_for_once_the_one_before_it_is_lent_out(opening: int) -> None:
    """``opening`` units are asked for when the stream is made; after that, lending out unit i asks for
    unit i + 1 and no further: one unit ahead, however long the pass."""
    fetch = FakeFetch()
    units = stream(fetch, opening=opening)
    assert fetch.asked == list(range(opening))
    for unit in units:
        assert fetch.asked == list(range(min(max(opening, unit.index + 2), N)))
    assert fetch.asked == list(range(N))


@pytest.mark.parametrize("opening", [1, 2])
def test_never_more_than_the_unit_lent_out_and_the_next_are_alive(opening: int) -> None:
    """The unit lent out is let go before the next is waited for and the one after it asked for."""
    fetch = FakeFetch()
    for unit in stream(fetch, opening=opening):
        assert unit.params["w"][0] == unit.index
        assert fetch.live <= 2
    assert fetch.max_live == 2
    assert fetch.live == 0  # the end of the pass lets go of the last one


def test_lent_units_are_taken_back_in_order_and_cannot_be_used_after() -> None:
    """Holding on to the handles does not hold the weights: each is emptied when the next unit is asked
    for, and reading it after says so."""
    fetch = FakeFetch()
    lent = list(stream(fetch))
    assert fetch.freed == list(range(N)) and fetch.live == 0
    with pytest.raises(RuntimeError, match="unit 2's weights were already taken back"):
        _ = lent[2].params


def test_kept_units_open_the_reverse_pass_without_a_fetch() -> None:
    """Backward after forward: the last unit is kept, lent out first without a fetch, and the next one is
    asked for when the reverse pass is made. Still two units alive at most, across both passes."""
    fetch = FakeFetch()
    forward = stream(fetch, opening=2, keep=1)
    assert [u.index for u in forward] == list(range(N))
    assert fetch.live == 1  # the kept one
    backward = forward.reverse(fetch)
    assert fetch.asked == [*range(N), N - 2]  # asked for at once: it arrives while N - 1 computes
    lent = []
    for unit in backward:
        assert fetch.live <= 2
        lent.append(unit.index)
    assert lent == list(reversed(range(N)))
    assert fetch.asked == [*range(N), *reversed(range(N - 1))]
    assert fetch.max_live == 2 and fetch.live == 0


def test_keeping_every_unit_makes_the_reverse_pass_fetch_nothing() -> None:
    """Pipelined: every unit stays from forward to backward, and each goes once backward has used it."""
    fetch = FakeFetch()
    forward = stream(fetch, opening=2, keep=N)
    assert [u.index for u in forward] == list(range(N))
    assert fetch.live == N
    left = []
    for unit in forward.reverse(fetch):
        left.append(fetch.live)
        assert unit.params["w"][0] == unit.index
    assert fetch.asked == list(range(N))
    assert left == list(range(N, 0, -1)) and fetch.live == 0


def test_a_pass_reverses_only_once_it_is_over() -> None:
    fetch = FakeFetch()
    forward = stream(fetch, keep=1)
    next(forward)
    with pytest.raises(RuntimeError, match="lent out 1 of its 6 units"):
        forward.reverse(fetch)


@pytest.mark.parametrize("where", ["forward", "loss", "backward"])
def test_an_error_mid_step_lets_go_of_every_unit(where: str) -> None:
    """Leaving the streams on an error lets go of every unit while the caller still holds the handle: the
    one lent out, the one that arrived ahead, those kept for the reverse pass (the error between the
    passes: in the loss), and a fetch not yet started is cancelled."""
    fetch = FakeFetch(never_arrive=frozenset({N}))  # the reverse pass's first fetch
    forward = stream(fetch, opening=2, keep=3)
    unit = None
    with pytest.raises(ValueError, match="computing failed"), forward:
        for unit in forward:
            if where == "forward" and unit.index == 2:
                raise ValueError("computing failed")
        assert fetch.live == 3  # the kept ones
        if where == "loss":
            raise ValueError("computing failed")
        with forward.reverse(fetch) as backward:
            for unit in backward:
                if unit.index == N - 2:
                    raise ValueError("computing failed")
    assert unit is not None and unit.index == {"forward": 2, "loss": N - 1, "backward": N - 2}[where]
    assert fetch.live == 0  # the handle is still held here, the weights are not
    if where == "backward":
        assert fetch.never_arrived[0].cancelled()  # N - 4: asked for with the reverse pass, never arrived


def test_a_closed_worker_gives_up_before_waiting_for_the_next_fetched_unit() -> None:
    """``check_open`` runs before each wait for a fetched unit, not for a kept one (already here, no
    wait): a closed worker stops at its next fetch."""
    fetch = FakeFetch()
    closed = threading.Event()
    checks: list[int] = []

    def check_open() -> None:
        checks.append(len(fetch.asked))
        if closed.is_set():
            raise Closed

    forward = UnitStream(fetch, range(N), WaitClock(), check_open, opening=2, keep=1)
    for _ in forward:
        pass
    assert len(checks) == N
    backward = forward.reverse(fetch)
    closed.set()
    assert next(backward).index == N - 1  # kept: no check
    with pytest.raises(Closed):
        next(backward)
    assert len(checks) == N + 1


@pytest.mark.usefixtures("ticking_clock")
def test_the_clock_counts_each_wait_for_a_fetched_unit_and_none_for_a_kept_one() -> None:
    fetch = FakeFetch()
    clock = WaitClock()
    forward = UnitStream(fetch, range(N), clock, lambda: None, opening=2, keep=1)
    for _ in forward:
        pass
    assert clock.seconds == N
    for _ in forward.reverse(fetch):
        pass
    assert clock.seconds == N + N - 1


class RecordedPush(Future[None]):
    """A push that is already done; waiting for it is recorded in ``events``."""

    def __init__(self, unit: int, events: list[str]) -> None:
        super().__init__()
        self.unit, self.events = unit, events
        self.set_result(None)

    def result(self, timeout: float | None = None) -> None:
        self.events.append(f"wait {self.unit}")
        return super().result(timeout)


@pytest.mark.usefixtures("ticking_clock")
def test_a_push_waits_for_the_one_in_flight_and_drain_for_the_last() -> None:
    """Back-pressure: with one push in flight, each push first waits for the one before it; the waits are
    on the clock (one second each here), the drain's counted as one."""
    events: list[str] = []

    def push(unit: int, grads: Tensors) -> Future[None]:
        events.append(f"push {unit}")
        return RecordedPush(unit, events)

    clock = WaitClock()
    pushes = GradientPushes(push, clock)
    for u in (3, 2, 1):
        pushes.push(u, {})
    assert events == ["push 3", "wait 3", "push 2", "wait 2", "push 1"]
    pushes.drain()
    assert events[-1] == "wait 1" and clock.seconds == 3

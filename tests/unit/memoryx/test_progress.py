"""A MemoryX shard's progress alone (memoryx/progress.py): its waits are counted while they block, so a
caller can wait for a call to be blocked; closing wakes them and then waits for the update in flight."""

from __future__ import annotations

import threading

import pytest

from tests.memoryx_shards import WAIT_S, in_thread
from weightstream.memoryx.errors import ShardClosedError
from weightstream.memoryx.progress import ShardProgress
from weightstream.transport.fencing import StaleGenerationError


def test_a_wait_is_counted_while_it_blocks_and_only_then() -> None:
    progress = ShardProgress(timeout_s=WAIT_S)
    with progress:
        assert progress.wait(lambda: True) and progress.waiting == 0  # ready at once: never blocked
    ready = threading.Event()

    def wait() -> bool:
        with progress:
            return progress.wait(ready.is_set)

    waiter, out = in_thread(wait)
    assert progress.wait_for_waiters(1, WAIT_S) and progress.waiting == 1
    with progress:
        ready.set()
        progress.notify()
    waiter.join(WAIT_S)
    assert out == [True] and progress.waiting == 0


def test_the_update_in_flight_is_waited_for_and_its_finished_tensors_announced() -> None:
    progress = ShardProgress(timeout_s=WAIT_S)

    def fresh_once_b_is() -> set[str]:
        with progress:
            progress.wait(lambda: "b" in progress.fresh)
            return set(progress.fresh)

    def idle() -> None:
        with progress:
            progress.idle()

    with progress:
        progress.begin_update(0)
    reader, fresh = in_thread(fresh_once_b_is)
    assert progress.wait_for_waiters(1, WAIT_S)
    with progress:
        progress.updated("a")  # not what it waits for: it waits on
    with progress:
        progress.updated("b")
    reader.join(WAIT_S)
    assert fresh == [{"a", "b"}]
    idler, _ = in_thread(idle)
    assert progress.wait_for_waiters(1, WAIT_S), "the update is not over"
    with progress:
        progress.end_update()
    idler.join(WAIT_S)
    assert not idler.is_alive() and progress.fresh == set() and progress.waiting == 0


def test_close_wakes_the_waiting_calls_then_waits_for_the_update_in_flight() -> None:
    progress = ShardProgress(timeout_s=60)  # a wait not woken would outlast the test by far
    errors: list[BaseException] = []

    def wait_idle() -> None:
        with progress:
            try:
                progress.idle()
            except ShardClosedError as e:
                errors.append(e)

    def close() -> None:
        with progress:
            progress.close()

    with progress:
        progress.begin_update(4)
    waiter, _ = in_thread(wait_idle)
    assert progress.wait_for_waiters(1, WAIT_S)
    closer, _ = in_thread(close)
    waiter.join(WAIT_S)
    assert len(errors) == 1, "a call waiting for an update must give up when the shard closes"
    assert progress.wait_for_waiters(1, WAIT_S), "the close must wait for the update in flight"
    with progress:
        progress.end_update()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    with progress, pytest.raises(ShardClosedError):  # and any later wait fails at once
        progress.wait(lambda: True)


def test_an_update_outlasting_the_timeout_and_another_generation_are_refused() -> None:
    progress = ShardProgress(timeout_s=0.05, step=3, generation=2)
    with progress:
        progress.begin_update(3)
        with pytest.raises(TimeoutError, match=r"the update of step 3 still running after 0\.05s"):
            progress.idle()
        progress.check(2, "a gradient")
        with pytest.raises(StaleGenerationError, match="generation 1 refused"):
            progress.check(1, "a gradient")

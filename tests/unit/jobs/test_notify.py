"""The store's change feed: waiters on any number of event loops are woken by commits from any thread,
without polling, without missing a change, and without leaving anything behind when they give up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until_async
from weightstream.jobs.notify import Event, JobFeed, follow
from weightstream.jobs.store import JobStore


async def _parked(feed: JobFeed, n: int) -> None:
    """Until ``n`` waiters are parked on ``feed`` (they park on their first await)."""
    await wait_until_async(lambda: feed.waiting() >= n, lambda: f"{n} waiters parked ({feed.waiting()} are)")


def test_a_waiter_is_woken_by_a_publish_from_another_thread() -> None:
    feed = JobFeed()

    async def main() -> tuple[int, float]:
        seen = feed.version("a")
        waiter = asyncio.create_task(feed.wait("a", seen))  # no timeout: only a publish ends it
        await _parked(feed, 1)
        published = 0.0

        def publish() -> None:
            nonlocal published
            published = time.monotonic()
            feed.publish("a")

        threading.Thread(target=publish).start()
        version = await asyncio.wait_for(waiter, 10)
        return version, time.monotonic() - published

    version, latency = asyncio.run(main())
    assert version == 1
    assert latency < 1.0  # pushed, so milliseconds; generous for a loaded machine
    assert feed.waiting() == 0


def test_many_loops_wake_on_one_publish_and_other_jobs_stay_asleep() -> None:
    """Eight threads, each with its own event loop and waiters on job a, on any job and on job b: one
    publish of a wakes every a and any-job waiter on every loop; the b waiters sleep on."""
    feed = JobFeed()
    loops, per_loop = 8, 5
    ready = threading.Barrier(loops + 1)
    results: list[tuple[list[int], list[bool]] | BaseException] = []
    lock = threading.Lock()

    def run_loop() -> None:
        async def main() -> tuple[list[int], list[bool]]:
            on_a = [asyncio.create_task(feed.wait("a", 0)) for _ in range(per_loop)]
            on_any = [asyncio.create_task(feed.wait(None, 0)) for _ in range(per_loop)]
            on_b = [asyncio.create_task(feed.wait("b", 0)) for _ in range(per_loop)]
            await asyncio.sleep(0)  # every task parks on its first step
            await asyncio.to_thread(ready.wait)
            woken = await asyncio.wait_for(asyncio.gather(*on_a, *on_any), 10)  # only a publish ends them
            b_done = [t.done() for t in on_b]  # the same wake-up would have reached them by now
            for t in on_b:
                t.cancel()
            return woken, b_done

        try:
            outcome: tuple[list[int], list[bool]] | BaseException = asyncio.run(main())
        except BaseException as e:  # reported below, not lost with the thread
            outcome = e
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run_loop) for _ in range(loops)]
    for t in threads:
        t.start()
    ready.wait(timeout=10)
    feed.publish("a")
    for t in threads:
        t.join(timeout=20)
    assert len(results) == loops
    for outcome in results:
        assert not isinstance(outcome, BaseException), f"a loop's waiters were not woken: {outcome!r}"
        woken, b_done = outcome
        assert woken == [1] * (2 * per_loop)
        assert b_done == [False] * per_loop  # job b never changed: its waiters were not woken
    assert feed.version("b") == 0 and feed.waiting() == 0


def test_a_change_between_reading_and_waiting_is_not_missed() -> None:
    feed = JobFeed()
    seen = feed.version("a")
    feed.publish("a")  # lands after the read, before the wait
    # no timeout of its own: a wait that parked here would only end at wait_for's deadline
    assert asyncio.run(asyncio.wait_for(feed.wait("a", seen), 5)) == 1


def test_timeouts_and_cancelled_waiters_leave_nothing_behind() -> None:
    feed = JobFeed()

    async def main() -> None:
        assert await feed.wait("a", 0, timeout=0.01) == 0  # timed out: the version it had
        cancelled = asyncio.create_task(feed.wait("a", 0))
        await _parked(feed, 1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    asyncio.run(main())
    assert feed.waiting() == 0
    feed.publish("a")  # nobody to wake, nothing to fail


def test_a_waiter_on_a_closed_loop_does_not_break_publishing() -> None:
    feed = JobFeed()
    loop = asyncio.new_event_loop()
    task = loop.create_task(feed.wait("a", 0))
    loop.run_until_complete(asyncio.sleep(0))  # the task parks its future
    assert feed.waiting() == 1
    loop.close()  # gone without cancelling it (a server thread that died)
    feed.publish("a")  # must not raise: the job's writer is a job thread that must carry on
    # the abandoned task can be neither run nor cancelled now; asyncio's own flag quiets its epitaph
    task._log_destroy_pending = False  # type: ignore[attr-defined]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.sqlite")
    s.create("j", {}, 1, {}, 2, tmp_path / "j")
    s.transition("j", "running")
    yield s
    s.close()


def test_follow_reads_the_store_once_per_change_and_ends_with_the_job(store: JobStore) -> None:
    """No polling: while the job is quiet the store is not read again; each commit from a job thread
    is one more read; the job's end ends the stream with every event up to it."""
    reads = 0

    def read(after: int) -> tuple[bool, list[Event]]:
        nonlocal reads
        reads += 1
        return store.tail("j", after)

    async def main() -> list[tuple[str, object]]:
        got: list[tuple[str, object]] = []
        caught_up = asyncio.Event()

        async def consume() -> None:
            async for e in follow(store.feed, "j", read):
                assert e is not None  # no idle_s: no keepalives
                got.append((e["kind"], e["data"].get("status", e["data"].get("step"))))
                if len(got) == 2:
                    caught_up.set()

        task = asyncio.create_task(consume())
        await caught_up.wait()
        await asyncio.sleep(0.5)  # quiet: a polling follower would read again here
        assert reads == 1
        await asyncio.to_thread(store.add_event, "j", "step", {"step": 1})
        await wait_until_async(lambda: len(got) == 3, lambda: f"the step event (got {got})", 10)
        assert reads == 2
        await asyncio.to_thread(store.transition, "j", "succeeded")
        await asyncio.wait_for(task, 10)
        return got

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert got == [("status", "queued"), ("status", "running"), ("step", 1), ("status", "succeeded")]
    assert store.feed.waiting() == 0


def test_follow_yields_none_when_idle_and_once_without_live(store: JobStore) -> None:
    async def main() -> tuple[list[Event | None], list[Event | None]]:
        read = lambda after: store.tail("j", after)  # noqa: E731
        idle: list[Event | None] = []
        async for e in follow(store.feed, "j", read, idle_s=0.05):
            idle.append(e)
            if e is None:
                break

        async def once() -> list[Event | None]:
            return [e async for e in follow(store.feed, "j", read, after=1, live=False)]

        return idle, await asyncio.wait_for(once(), 10)  # without live it must end by itself

    idle, once = asyncio.run(asyncio.wait_for(main(), 20))
    assert [e["seq"] if e else None for e in idle] == [1, 2, None]
    assert [e["seq"] for e in once if e] == [2]
    assert store.feed.waiting() == 0

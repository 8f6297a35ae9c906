"""Wake-ups for whoever follows a job: the store publishes every committed change, waiters await it.

The store is written from job threads and the scheduler; followers are coroutines on one or more event
loops (uvicorn's for server-sent events, the gRPC server's for ``WatchJob``). A follower holds no thread
while it waits: it parks a future that ``publish`` resolves through ``loop.call_soon_threadsafe``.

Each job has a version, a counter bumped after every commit that touches it (``None`` counts every
job). A follower reads the version *before* it reads the store and then waits for the version to move
on, so a change committed between its read and its wait is never missed: the wait returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

__all__ = ["Event", "JobFeed", "Reader", "follow"]

Event = dict[str, Any]  # {"seq", "at", "kind", "data"} as JobStore.events returns them
# read(after) -> (the job had finished when this was read, its events with seq > after)
Reader = Callable[[int], tuple[bool, list[Event]]]


class JobFeed:
    """Per-job change counters with asyncio waiters; ``publish`` may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # one int per job this process has seen change: a few bytes each, kept so versions never go back
        self._versions: dict[str | None, int] = {}
        self._waiters: dict[str | None, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    def version(self, job_id: str | None = None) -> int:
        """The number of changes published so far for ``job_id`` (``None``: for any job)."""
        with self._lock:
            return self._versions.get(job_id, 0)

    def publish(self, job_id: str) -> None:
        """Record a committed change of ``job_id`` and wake everyone waiting for it or for any job."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        with self._lock:
            for key in (job_id, None):
                self._versions[key] = self._versions.get(key, 0) + 1
                for loop, fut in self._waiters.pop(key, ()):
                    by_loop.setdefault(loop, []).append(fut)
        for loop, futures in by_loop.items():  # one wake-up per loop, however many wait on it
            with contextlib.suppress(RuntimeError):  # that loop is closed: its waiters went with it
                loop.call_soon_threadsafe(_resolve, futures)

    async def wait(self, job_id: str | None, seen: int, timeout: float | None = None) -> int:
        """Wait until ``job_id``'s version differs from ``seen`` (at once if it already does) or
        ``timeout`` seconds pass; returns the version then (still ``seen`` if nothing changed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            current = self._versions.get(job_id, 0)
            if current != seen:
                return current
            fut: asyncio.Future[None] = loop.create_future()
            waiter = (loop, fut)
            self._waiters.setdefault(job_id, set()).add(waiter)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:  # a timeout or a cancelled follower must not leave its future behind
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[job_id]
        return self.version(job_id)

    def waiting(self) -> int:
        """How many waiters are parked now, over all jobs (tests check that none is left behind)."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():  # a waiter may have been cancelled meanwhile
            fut.set_result(None)


async def follow(
    feed: JobFeed,
    job_id: str,
    read: Reader,
    *,
    after: int = 0,
    live: bool = True,
    idle_s: float | None = None,
) -> AsyncIterator[Event | None]:
    """A job's events with seq > ``after``; with ``live``, new ones as they are committed until the job
    has finished. ``read`` runs in a worker thread (it is SQLite), never on the event loop. With
    ``idle_s``, ``None`` is yielded after that many seconds without a change (the caller's keepalive)."""
    seq = after
    while True:
        seen = feed.version(job_id)  # before the read: a commit after it is a wake-up below
        finished, events = await asyncio.to_thread(read, seq)
        for event in events:
            seq = event["seq"]
            yield event
        # ``finished`` was read with the events, so every event up to the job's end is already out
        if finished or not live:
            return
        while await feed.wait(job_id, seen, idle_s) == seen:
            yield None

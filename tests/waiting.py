"""Waiting for another thread or process to reach a state: poll the state itself, under a deadline, and on
timeout fail naming what was awaited (and the state as it was then). Tests wait with this, not with a
fixed sleep: a sleep is too short on a loaded machine and too long everywhere else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# how often the state is looked at: short next to any wait worth writing, long next to a look's cost
POLL_S = 0.01


def wait_until(
    predicate: Callable[[], object],
    what: str | Callable[[], str],
    timeout: float = 5.0,
    poll_s: float = POLL_S,
) -> None:
    """Return as soon as ``predicate()`` is true; after ``timeout`` seconds fail with ``what`` (a callable:
    called then, so that it can describe the state the wait gave up on)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {described}")
        time.sleep(poll_s)


async def wait_until_async(
    predicate: Callable[[], object],
    what: str | Callable[[], str],
    timeout: float = 5.0,
    poll_s: float = POLL_S,
) -> None:
    """``wait_until`` for a coroutine: the event loop runs on between looks (the state is often changed by
    a task of this same loop)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {described}")
        await asyncio.sleep(poll_s)

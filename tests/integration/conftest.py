"""Fixtures for integration tests that need more than loopback: emulated hosts (root only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from testbed import EmulatedHosts, unavailable


@pytest.fixture
def emulated_hosts() -> Iterator[Callable[..., EmulatedHosts]]:
    """``make(count, rate=None)``: emulated hosts h1..h<count>, torn down after the test, which then fails
    if anything of them is left on the machine. Skips, saying why, where hosts cannot be made."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    made: list[EmulatedHosts] = []

    def make(count: int, rate: str | None = None) -> EmulatedHosts:
        made.append(EmulatedHosts(count, rate=rate))
        return made[-1]

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
        left = [item for cluster in made for item in cluster.leftovers()]
        assert left == [], f"emulated hosts left behind: {left}"

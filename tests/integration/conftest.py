"""Fixtures for integration tests that need more than loopback: emulated hosts and a Slurm cluster on them
(root only)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from testbed import EmulatedHosts, unavailable
from testbed.slurm import SlurmCluster, slurm_unavailable


def skip_or_fail(reason: str | None) -> None:
    """Skip with ``reason`` (None: go on), or fail where WEIGHTSTREAM_REQUIRE_HOSTS is set: CI, root with
    Slurm installed, must run these tests rather than skip them."""
    if reason is not None:
        if os.environ.get("WEIGHTSTREAM_REQUIRE_HOSTS"):
            pytest.fail(f"WEIGHTSTREAM_REQUIRE_HOSTS is set, but {reason}")
        pytest.skip(reason)


@pytest.fixture
def hosts_possible() -> None:
    """For tests that make emulated hosts other than through ``emulated_hosts`` (a script): skip or fail
    as it does."""
    skip_or_fail(unavailable())
    skip_or_fail(slurm_unavailable())


@pytest.fixture
def emulated_hosts() -> Iterator[Callable[..., EmulatedHosts]]:
    """``make(count, rate=None)``: emulated hosts h1..h<count>, torn down after the test, which then fails
    if anything of them is left on the machine. Skips, saying why, where hosts cannot be made."""
    skip_or_fail(unavailable())
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


@pytest.fixture
def slurm_cluster(emulated_hosts: Callable[..., EmulatedHosts]) -> Iterator[SlurmCluster]:
    """A real Slurm cluster on four emulated hosts h1..h4, every node idle; stopped after the test, which
    then fails if a daemon or a file of it is left. Skips, saying why, without Slurm or hosts."""
    skip_or_fail(slurm_unavailable())
    cluster = SlurmCluster(emulated_hosts(4))
    try:
        yield cluster
    finally:
        strays = cluster.strays(grace_s=10)  # a test's own sruns and roles: each must end with the test
        cluster.close()
        assert cluster.leftovers() == [], f"Slurm cluster left behind: {cluster.leftovers()}"
        assert strays == {}, f"processes still running against the Slurm cluster: {strays}"

"""The emulated hosts' pure pieces: link rates, the reason they cannot be made, the Slurm configuration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import testbed.hosts
from testbed import EmulatedHosts, HostsUnavailable, parse_rate, unavailable
from testbed.slurm import slurm_conf


@pytest.mark.parametrize(
    ("rate", "bits"), [("100mbit", 10**8), ("1gbit", 10**9), ("2.5gbit", 25 * 10**8), ("500kbit", 5 * 10**5)]
)
def test_link_rates_read_as_tc_writes_them(rate: str, bits: int) -> None:
    assert parse_rate(rate) == bits


def test_a_rate_without_a_unit_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'100'.*mbit"):
        parse_rate("100")


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    unavailable.cache_clear()
    monkeypatch.setattr(testbed.hosts.os, "geteuid", lambda: 1000)
    yield
    unavailable.cache_clear()


@pytest.mark.usefixtures("not_root")
def test_without_root_hosts_are_refused_saying_why() -> None:
    assert unavailable() == "emulated hosts need root (namespaces, veth links, tc)"
    with pytest.raises(HostsUnavailable, match="need root"):
        EmulatedHosts(2)


class FakeHosts:
    """What slurm_conf reads of EmulatedHosts: a tag and hosts with names and addresses."""

    tag = "wshabc123"

    def __iter__(self) -> Iterator[SimpleNamespace]:
        return iter([SimpleNamespace(name=f"h{i}", address=f"198.18.0.{10 + i}") for i in (1, 2)])


def test_slurm_conf_names_the_controller_by_the_machine_and_every_host_by_its_address() -> None:
    fake: Any = FakeHosts()  # what slurm_conf reads of EmulatedHosts
    conf = slurm_conf(Path("/run/c"), fake, "vm", Path("/run/c/munge.socket"))
    lines = conf.splitlines()
    # slurmctld starts only where SlurmctldHost names its own host; the nodes reach it at the bridge
    assert "SlurmctldHost=vm(198.18.0.1)" in lines
    assert "AuthInfo=socket=/run/c/munge.socket" in lines
    assert [line.split()[:2] for line in lines if line.startswith("NodeName=")] == [
        ["NodeName=h1", "NodeAddr=198.18.0.11"],
        ["NodeName=h2", "NodeAddr=198.18.0.12"],
    ]
    # every file of the cluster in its own directory: nothing of the machine's /etc/slurm or /var
    paths = [line.rsplit("=", 1)[1] for line in lines if "=/" in line and not line.startswith("MailProg=")]
    assert len(paths) == 8 and all(path.startswith("/run/c/") for path in paths)

"""A real Slurm cluster on emulated hosts: every host a node, srun runs inside the host it names,
heterogeneous jobs span nodes, a killed host goes DOWN, and nothing of the cluster outlives it."""

from __future__ import annotations

import pytest

from testbed.slurm import SlurmCluster
from tests.waiting import wait_until

# a Slurm cluster each (~3 s a test): in the slow phase, which CI runs too
pytestmark = [pytest.mark.hosts, pytest.mark.slow]

TIMEOUT = 60  # seconds for one Slurm command; a job of these tests takes about one


def out(cluster: SlurmCluster, argv: list[str]) -> str:
    done = cluster.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_host_is_an_idle_node_at_its_address(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.node_states() == {"h1": "idle", "h2": "idle", "h3": "idle", "h4": "idle"}
    for host in slurm_cluster.hosts:
        assert f"NodeAddr={host.address} " in out(slurm_cluster, ["scontrol", "show", "node", host.name])


def test_srun_runs_inside_the_host_it_names(slurm_cluster: SlurmCluster) -> None:
    for host in slurm_cluster.hosts:
        # its hostname; PID 1 of its PID namespace is that host's own; and the job is a process of it
        job = "hostname; tr '\\0' ' ' < /proc/1/cmdline; echo; readlink /proc/self"
        name, init, pid = out(slurm_cluster, ["srun", "-w", host.name, "sh", "-c", job]).splitlines()
        assert name == host.name
        assert f" host {host.name} " in init  # _init.py's arguments
        assert pid.isdigit()  # a process outside the host's PID namespace has no /proc/self in its /proc


def test_a_heterogeneous_job_runs_each_command_on_its_own_node(slurm_cluster: SlurmCluster) -> None:
    job = ["srun", "-w", "h1", "sh", "-c", "echo first $(hostname)", ":",
           "-w", "h3", "sh", "-c", "echo second $(hostname)"]  # fmt: skip
    assert sorted(out(slurm_cluster, job).splitlines()) == ["first h1", "second h3"]


@pytest.mark.slow
def test_a_killed_host_is_marked_down_within_a_bound(slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.hosts.kill("h4")
    bound = 30  # seconds; measured here: 13 to 16 s with SlurmdTimeout=6
    wait_until(  # Slurm tells no one when it marks a node: its state is polled
        lambda: slurm_cluster.node_states().get("h4", "").startswith("down"),
        f"h4 DOWN within {bound} s of its host's kill",
        bound,
        poll_s=0.5,
    )
    assert {name: state for name, state in slurm_cluster.node_states().items() if name != "h4"} == {
        "h1": "idle", "h2": "idle", "h3": "idle"}  # fmt: skip


def test_closing_stops_every_daemon_and_removes_its_files(slurm_cluster: SlurmCluster) -> None:
    daemons = slurm_cluster.daemon_pids()
    assert sorted(daemons) == ["munged", "slurmctld"] + [f"slurmd on h{i}" for i in range(1, 5)]
    assert slurm_cluster.leftovers() != []  # the check sees a live cluster
    slurm_cluster.close()
    assert slurm_cluster.leftovers() == []
    assert not slurm_cluster.dir.exists()

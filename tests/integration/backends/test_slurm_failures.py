"""`weightstream run --backend slurm` where the cluster cannot run the job: each failure ends the run with
a message naming its cause (and the Slurm job, once there is one), and leaves no Slurm job and no process
on any host."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import host_processes, slurm_jobs, tiny_gpt2, weightstream_run

# a Slurm cluster each (3-8 s a test): in the slow phase, which CI runs too
pytestmark = [pytest.mark.hosts, pytest.mark.slow]


def failed_run(cluster: SlurmCluster, tmp_path: Path, *args: str) -> str:
    """The run's error output, once it has failed (exit status 1) leaving nothing behind."""
    done = weightstream_run(cluster, tiny_gpt2(tmp_path), tmp_path / "model", "--backend", "slurm", *args)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("job failed:"), said
    assert slurm_jobs(cluster) == [] and host_processes(cluster) == {}
    return said


def test_a_partition_that_does_not_exist(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    said = failed_run(slurm_cluster, tmp_path, "--partition", "gpus")
    assert "Slurm has no partition 'gpus'; its partitions: all" in said


def test_a_feature_no_node_has(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    said = failed_run(slurm_cluster, tmp_path, "--worker_features", "wafer")
    assert "no Slurm node has the feature wafer" in said


def test_too_few_nodes_for_the_workers(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    said = failed_run(slurm_cluster, tmp_path, "--num_csx", "8")
    assert "cannot hold the job (idle nodes): 8 CS-2 workers need 8 nodes of their own" in said
    assert "4 of the 4 nodes given can serve them: h1, h2, h3, h4" in said


def test_an_unreachable_slurm_controller(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    os.kill(slurm_cluster.daemon_pids()["slurmctld"], signal.SIGKILL)
    done = weightstream_run(slurm_cluster, tiny_gpt2(tmp_path), tmp_path / "model", "--backend", "slurm")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    said = " ".join(done.stderr.split())
    assert "sinfo: " in said and "Unable to contact slurm controller" in said, said
    assert host_processes(slurm_cluster) == {}


def test_a_node_that_does_not_see_model_dir(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # h3 (a server node) gets a model_dir/logs of its own: what it writes there, this machine never sees
    logs = tmp_path / "model" / "logs"
    logs.mkdir(parents=True)
    slurm_cluster.hosts["h3"].run(["mount", "-t", "tmpfs", "tmpfs", str(logs)], check=True, timeout=30)
    said = failed_run(slurm_cluster, tmp_path)
    assert "model_dir must be on a filesystem every node shares: node h3 wrote to" in said
    assert "(Slurm job 1)" in said


@pytest.mark.slow  # about 20 s: srun gives up on the node only after Slurm's message timeouts
def test_a_node_that_never_starts_its_role(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # h2's slurmd is gone, but Slurm still lists h2 idle (for SlurmdTimeout): the job is placed there
    os.kill(slurm_cluster.daemon_pids()["slurmd on h2"], signal.SIGKILL)
    t0 = time.monotonic()
    said = failed_run(slurm_cluster, tmp_path)
    assert "node h2 did not run the check" in said and "(Slurm job 1)" in said
    assert time.monotonic() - t0 < 90

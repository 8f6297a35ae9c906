"""`weightstream serve --backend slurm` on a real Slurm cluster of four emulated hosts, driven with `wsctl`:
each job runs as a Slurm job named after it (its priority as Slurm's nice), `wsctl cancel` leaves nothing
on any host, and a service SIGKILLed mid-job finds what it left in Slurm when restarted and resumes the
job from its checkpoint, ending bitwise as a run without interruption."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import (
    checkpoint_bytes,
    host_processes,
    slurm_jobs,
    steps_logged,
    tiny_gpt2,
    weightstream_run,
)
from tests.integration.backends.slurm_service import SlurmService, slurm_jobs_named
from tests.waiting import wait_until

# a Slurm cluster and real jobs each: in the slow phase, which CI runs too
pytestmark = [pytest.mark.hosts, pytest.mark.slow]


def gpt2(tmp_path: Path, steps: int, checkpoint_steps: int | None = None) -> Path:
    """tiny_gpt2 logging every step, checkpointed every ``checkpoint_steps`` (default: at the end)."""
    path = tiny_gpt2(tmp_path, steps)
    params = yaml.safe_load(path.read_text())
    init = params["trainer"]["init"]
    init["logging"]["log_steps"] = 1
    init["checkpoint"]["steps"] = checkpoint_steps or steps
    path.write_text(yaml.safe_dump(params))
    return path


def service_until(what: str, ready: Callable[[], bool], service: SlurmService, timeout: float = 180) -> None:
    """``ready`` within ``timeout``, or fail naming ``what`` with the service's log; a job's files and
    Slurm's queue are the only signals a test outside them has, so they are polled (every 0.2 s)."""
    wait_until(ready, lambda: f"{what}: {service.log.read_text()[-3000:]}", timeout, poll_s=0.2)


def running(cluster: SlurmCluster) -> list[str]:
    """The jobs Slurm runs ("id name RUNNING")."""
    return [line + " " for line in slurm_jobs(cluster) if line.endswith(" RUNNING")]


def nothing_left(cluster: SlurmCluster) -> bool:
    return slurm_jobs(cluster) == [] and host_processes(cluster) == {}


# two real jobs through the service on the cluster (~35 s)
@pytest.mark.slow
def test_a_job_runs_as_a_slurm_job_and_cancel_leaves_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    service = SlurmService(slurm_cluster, tmp_path / "data").start()
    try:
        first = service.wsctl("submit", str(gpt2(tmp_path, 2)), "--num_csx", "2", "--priority", "3").strip()
        name = f"weightstream-{first}"
        service_until("its Slurm job", lambda: name in slurm_jobs_named(slurm_cluster), service)
        assert slurm_jobs_named(slurm_cluster)[name] == "200"  # priority 3: nice 200
        assert service.wait_status(first, "succeeded", "failed")["status"] == "succeeded"
        assert (tmp_path / "data" / "jobs" / first / "checkpoint_2").is_dir()
        service_until("nothing left", lambda: nothing_left(slurm_cluster), service, timeout=30)

        long = tmp_path / "long"
        long.mkdir()
        second = service.wsctl("submit", str(gpt2(long, 500)), "--num_csx", "2", "--priority", "1").strip()
        model_dir = tmp_path / "data" / "jobs" / second
        service_until("a first step", lambda: steps_logged(model_dir) >= 1, service)
        assert slurm_jobs_named(slurm_cluster)[f"weightstream-{second}"] == "0"  # priority 1: Slurm's default
        assert set(host_processes(slurm_cluster)) == {"h1", "h2", "h3", "h4"}  # its roles, on every host
        service.wsctl("cancel", "job", second)
        assert service.wait_status(second, "cancelled", "failed", "succeeded")["status"] == "cancelled"
        # once the service says cancelled, Slurm lists no job and no host runs anything of it
        assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}
    finally:
        service.close()
    assert nothing_left(slurm_cluster)


def test_the_service_places_its_jobs_by_its_options(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    service = SlurmService(slurm_cluster, tmp_path / "data", "--partition", "gpus").start()
    try:
        job = service.wsctl("submit", str(gpt2(tmp_path, 2)), "--num_csx", "2").strip()
        info = service.wait_status(job, "succeeded", "failed", timeout=60)
    finally:
        service.close()
    assert info["status"] == "failed" and "no partition 'gpus'" in info["error"], info
    assert nothing_left(slurm_cluster)


@pytest.mark.slow
def test_a_sigkilled_service_resumes_its_job_bitwise(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    params = gpt2(tmp_path, 60, checkpoint_steps=10)
    local = weightstream_run(None, params, tmp_path / "local")
    assert local.returncode == 0, local.stderr
    service = SlurmService(slurm_cluster, tmp_path / "data").start()
    try:
        job = service.wsctl("submit", str(params), "--num_csx", "2").strip()
        model_dir = tmp_path / "data" / "jobs" / job
        service_until("checkpoint_10", lambda: steps_logged(model_dir) >= 12, service)
        service.kill(signal.SIGKILL)
        # what a service that died leaves may outlive it: here a job of its name holding three nodes, as
        # the allocation of a service whose machine lost Slurm's controller would. Its two workers then
        # fit only once the restarted service has ended it.
        sbatch = ["sbatch", "--parsable", f"--job-name=weightstream-{job}", "--nodes=3", "--exclusive",
                  f"--output={tmp_path}/leftover-%j.out", "--wrap", "sleep 600"]  # fmt: skip
        leftover = slurm_cluster.run(
            sbatch, capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
        service_until(
            "the leftover running", lambda: f"{leftover} " in " ".join(running(slurm_cluster)), service
        )
        service.start()
        info = service.wait_status(job, "succeeded", "failed")
        assert info["status"] == "succeeded", (info, (model_dir / "run.log").read_text()[-3000:])
        assert f"ended Slurm job {leftover}, left by the service's previous run" in service.log.read_text()
    finally:
        service.close()
    run_log = (model_dir / "run.log").read_text()
    assert "resuming from" in run_log, run_log[-3000:]
    assert checkpoint_bytes(model_dir, 60) == checkpoint_bytes(tmp_path / "local", 60)
    assert nothing_left(slurm_cluster)

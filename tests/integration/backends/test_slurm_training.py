"""`weightstream run --backend slurm` on a real Slurm cluster of four emulated hosts: each role runs on the
host its placement names at that host's address, the credential shows nowhere, a SIGKILLed role is
replaced, and the final checkpoint is bitwise the one-host run's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import (
    PYTHONPATH,
    checkpoint_bytes,
    host_processes,
    slurm_jobs,
    steps_logged,
    tiny_gpt2,
    weightstream_run,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

TOKEN = re.compile(rb"[0-9a-f]{64}")  # a role credential as transport.auth makes them
STEPS = 40  # of the jobs a fault strikes mid-run


def assert_placed_where_it_ran(cluster: SlurmCluster, logs: Path) -> dict[str, str]:
    """Each role's ready file names the host placement.json gave it, and that host's address."""
    placed = json.loads((logs / "placement.json").read_text())["roles"]
    addresses = {h.name: h.address for h in cluster.hosts}
    for role, host in placed.items():
        ready = json.loads((logs / f"{role}.ready.json").read_text())
        assert ready["host"] == host, (role, ready)
        assert ready["address"].rsplit(":", 1)[0] == addresses[host], (role, ready)
    return placed


def bulk_figures(log: Path) -> dict[str, int]:
    """What a role's log says went through its bulk endpoint (its last line of them)."""
    said = re.findall(
        r"bulk transfers: served (\d+) \((\d+) bytes\), fetched (\d+) \((\d+) bytes\)", log.read_text()
    )
    assert said, f"{log.name} says nothing of bulk transfers"
    return dict(zip(("served", "served_bytes", "fetched", "fetched_bytes"), map(int, said[-1]), strict=True))


def test_gpt2_on_two_csx_across_hosts_is_bitwise_the_one_host_run(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    params = tiny_gpt2(tmp_path)
    local = weightstream_run(None, params, tmp_path / "local")
    assert local.returncode == 0, local.stderr
    done = weightstream_run(slurm_cluster, params, tmp_path / "slurm", "--backend", "slurm")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    placed = assert_placed_where_it_ran(slurm_cluster, tmp_path / "slurm" / "logs")
    assert placed["worker-0"] != placed["worker-1"]
    assert placed["activation-0"] == placed["worker-0"]
    servers = {placed[r] for r in ("memoryx-0", "memoryx-1", "swarmx-0")}
    assert servers.isdisjoint({placed["worker-0"], placed["worker-1"]})
    assert len(set(placed.values())) >= 3
    # between hosts the weights and gradients went as bulk transfers, beside gRPC
    bulk = {r: bulk_figures(tmp_path / "slurm" / "logs" / f"{r}.log") for r in placed}
    for w in ("worker-0", "worker-1"):  # weights in, gradients out, on every step
        assert bulk[w]["fetched"] >= 2 * 4 and bulk[w]["served"] >= 4, (w, bulk[w])
    for what in ("", "_bytes"):  # every transfer served was fetched by a role of the job, whole
        assert sum(b[f"served{what}"] for b in bulk.values()) == sum(
            b[f"fetched{what}"] for b in bulk.values()
        )
    final = checkpoint_bytes(tmp_path / "slurm", 4)
    assert final == checkpoint_bytes(tmp_path / "local", 4)
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}
    # a later run that fails (here: a partition that does not exist) loses no checkpoint
    failed = weightstream_run(slurm_cluster, params, tmp_path / "slurm", "--backend", "slurm",
                              "--max_steps", "8", "--partition", "gpus")  # fmt: skip
    assert failed.returncode == 1 and "no partition 'gpus'" in failed.stderr
    assert checkpoint_bytes(tmp_path / "slurm", 4) == final


def start_run(
    cluster: SlurmCluster, params: Path, model_dir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "weightstream.cli", "run", str(params), "--num_csx", "2",
            "--model_dir", str(model_dir), "--backend", "slurm"]  # fmt: skip
    env = {**cluster.env, "PYTHONPATH": PYTHONPATH, **(env or {})}
    return subprocess.Popen(cluster.command(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """``ready`` within ``timeout`` while the run goes on; the run's files are its only signal to a test
    outside it, so they are polled (every 0.2 s)."""

    def ready_while_running() -> bool:
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before {what}"
        return ready()

    wait_until(ready_while_running, what, timeout, poll_s=0.2)


def root_pid(cluster: SlurmCluster, host: str, inner_pid: int) -> int:
    """The machine's PID of process ``inner_pid`` of ``host``'s PID namespace."""
    for pid in cluster.hosts[host].processes():
        nspid = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()
        if int(nspid[-1]) == inner_pid:
            return pid
    raise LookupError(f"no process {inner_pid} on {host}")


@contextlib.contextmanager
def mid_run(cluster: SlurmCluster, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A job of STEPS steps on the cluster (model_dir ``tmp_path/slurm``) once it has logged a step, after
    the same job ran locally into ``tmp_path/local`` to compare with; killed on the way out if still running.
    STEPS leaves a loaded machine seconds to look the job over and strike before it ends."""
    params = tiny_gpt2(tmp_path, steps=STEPS)
    local = weightstream_run(None, params, tmp_path / "local")
    assert local.returncode == 0, local.stderr
    with running(cluster, params, tmp_path / "slurm") as run:
        yield run


@contextlib.contextmanager
def running(
    cluster: SlurmCluster, params: Path, model_dir: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``start_run`` once the job has logged a step; killed on the way out if still running."""
    run = start_run(cluster, params, model_dir, env)
    try:
        wait_for("a first step", lambda: steps_logged(model_dir) >= 1, run)
        yield run
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)


def test_credential_shows_nowhere_and_a_killed_role_is_replaced_bitwise(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    model_dir, logs = tmp_path / "slurm", tmp_path / "slurm" / "logs"
    with mid_run(slurm_cluster, tmp_path) as run:
        # while every role runs: no credential in what Slurm records, nor in any command line or environment
        job = json.loads((logs / "placement.json").read_text())["slurm_job"]
        said = [slurm_cluster.run(argv, capture_output=True, timeout=60, check=True).stdout
                for argv in (["scontrol", "show", "job", job], ["squeue", "--steps", "--format=%all"],
                             ["scontrol", "show", "step", job])]  # fmt: skip
        assert job.encode() in said[0]
        for text in said:
            assert not TOKEN.search(text), text
        pids = [p for host in slurm_cluster.hosts for p in host.processes()]
        pids += [p.pid for p in psutil.Process(run.pid).children(recursive=True)]  # srun, coordinator
        for pid in pids:
            for what in ("cmdline", "environ"):
                try:
                    data = Path(f"/proc/{pid}/{what}").read_bytes()
                except OSError:
                    continue  # gone meanwhile
                assert not TOKEN.search(data), (pid, what, data[:300])
        # SIGKILL worker-1 on its host: it comes back on that host, and training goes on
        before = json.loads((logs / "worker-1.ready.json").read_text())
        assert steps_logged(model_dir) < STEPS - 4, "the job ran out before the fault struck"
        os.kill(root_pid(slurm_cluster, before["host"], before["pid"]), signal.SIGKILL)
        out, _ = run.communicate(timeout=240)
    assert run.returncode == 0, out[-3000:]
    assert "restart 1/" in out, out[-3000:]
    after = json.loads((logs / "worker-1.ready.json").read_text())
    assert after["host"] == before["host"] and after["pid"] != before["pid"]
    assert_placed_where_it_ran(slurm_cluster, logs)
    assert checkpoint_bytes(model_dir, STEPS) == checkpoint_bytes(tmp_path / "local", STEPS)
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}


def test_inside_an_allocation_the_job_uses_it_and_leaves_it_to_its_owner(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # salloc runs the command here with SLURM_JOB_ID set, as a user at a login node does
    params, model_dir = tiny_gpt2(tmp_path, steps=2), tmp_path / "model"
    argv = ["salloc", "--nodes=3", "--exclusive", "--job-name=mine",
            sys.executable, "-m", "weightstream.cli", "run", str(params), "--num_csx", "2",
            "--model_dir", str(model_dir), "--backend", "slurm"]  # fmt: skip
    done = slurm_cluster.run(argv, capture_output=True, text=True, timeout=240, check=False,
                             env={"PYTHONPATH": PYTHONPATH})  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    granted = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert granted is not None, done.stderr
    record = json.loads((model_dir / "logs" / "placement.json").read_text())
    assert record["slurm_job"] == granted[1]
    placed = assert_placed_where_it_ran(slurm_cluster, model_dir / "logs")
    assert set(placed.values()) == {"h1", "h2", "h3"}  # the allocation's nodes, and no other
    assert (model_dir / "checkpoint_2").is_dir()
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}


def test_the_sbatch_example_of_the_docs_runs(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # docs/slurm.md's script, with this test's paths: the coordinator runs on the batch node (h1)
    params, model_dir = tiny_gpt2(tmp_path, steps=2), tmp_path / "model"
    script = tmp_path / "gpt2.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name=gpt2
#SBATCH --nodes=4
#SBATCH --exclusive
# a lost node takes its roles, not the job: they are replaced on the other nodes
#SBATCH --no-kill
#SBATCH --output={tmp_path}/gpt2-%j.out

# model_dir must be on a filesystem every node of the job sees (NFS, Lustre, GPFS...)
{sys.executable} -m weightstream.cli run {params} --num_csx 2 --backend slurm --model_dir {model_dir}
""")
    done = slurm_cluster.run(["sbatch", "--wait", str(script)], capture_output=True, text=True, timeout=240,
                             check=False, env={"PYTHONPATH": PYTHONPATH})  # fmt: skip
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    assert job is not None, done.stdout + done.stderr
    output = (tmp_path / f"gpt2-{job[1]}.out").read_text()
    assert done.returncode == 0, output[-3000:]
    assert json.loads((model_dir / "logs" / "placement.json").read_text())["slurm_job"] == job[1]
    assert_placed_where_it_ran(slurm_cluster, model_dir / "logs")
    assert "done: steps 0→2" in output
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}


def test_a_role_whose_host_is_lost_comes_back_on_another_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    model_dir, logs = tmp_path / "slurm", tmp_path / "slurm" / "logs"
    with mid_run(slurm_cluster, tmp_path) as run:
        lost = json.loads((logs / "worker-1.ready.json").read_text())["host"]
        assert steps_logged(model_dir) < STEPS - 4, "the job ran out before the fault struck"
        slurm_cluster.hosts.kill(lost)  # every process on it, its slurmd among them
        out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out[-3000:]
    after = json.loads((logs / "worker-1.ready.json").read_text())
    assert after["host"] != lost, after
    assert "restart 1/" in out, out[-3000:]
    assert checkpoint_bytes(model_dir, STEPS) == checkpoint_bytes(tmp_path / "local", STEPS)
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}


def test_a_killed_coordinator_leaves_no_job_and_no_role_behind(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    params, model_dir = tiny_gpt2(tmp_path, steps=50), tmp_path / "slurm"
    with running(slurm_cluster, params, model_dir) as run:
        children = psutil.Process(run.pid).children(recursive=True)  # its sruns and the salloc
        assert any(c.name() == "salloc" for c in children) and any(c.name() == "srun" for c in children)
        run.kill()  # the coordinator itself (nsenter -n execs it)
        run.communicate(timeout=30)
        wait_until(  # Slurm tells no one when it has ended a job: its state is polled
            lambda: (
                not (
                    slurm_jobs(slurm_cluster)
                    or host_processes(slurm_cluster)
                    or any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
                )
            ),
            lambda: (
                f"no job and no process left: {(slurm_jobs(slurm_cluster), host_processes(slurm_cluster))}"
            ),
            60,
            poll_s=0.5,
        )


def test_a_killed_coordinator_inside_an_allocation_leaves_no_role_behind(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # the user's allocation outlives the coordinator; the roles it started on its nodes must not
    held = slurm_cluster.run(["salloc", "--no-shell", "--nodes=3", "--exclusive", "--job-name=mine"],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    granted = re.search(r"Granted job allocation (\d+)", held.stderr)
    assert granted is not None, held.stderr
    job = granted[1]
    params, model_dir = tiny_gpt2(tmp_path, steps=STEPS), tmp_path / "slurm"
    try:
        with running(slurm_cluster, params, model_dir, env={"SLURM_JOB_ID": job}) as run:
            assert json.loads((model_dir / "logs" / "placement.json").read_text())["slurm_job"] == job
            sruns = [c for c in psutil.Process(run.pid).children(recursive=True) if c.name() == "srun"]
            assert sruns and host_processes(slurm_cluster)
            run.kill()  # the coordinator itself (nsenter -n execs it): no stop, no scancel of its steps
            run.communicate(timeout=30)
            wait_until(
                lambda: (
                    not (
                        host_processes(slurm_cluster)
                        or any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in sruns)
                    )
                ),
                lambda: f"no role left: {host_processes(slurm_cluster)}",
                60,
                poll_s=0.5,
            )
            # the allocation is the owner's, to end when they choose
            assert slurm_jobs(slurm_cluster) == [f"{job} mine RUNNING"]
    finally:
        slurm_cluster.run(["scancel", job], timeout=60, check=True)

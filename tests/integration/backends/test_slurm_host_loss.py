"""A whole host lost under `weightstream run --backend slurm` (four emulated hosts, a real Slurm): the host
of a MemoryX shard, a SwarmX node and another shard's replica is killed, slurmd with it, mid-job. Its
shard fails over to its replica (no step replayed), every role of the host comes back on another node,
and the job ends bitwise equal to a fault-free run."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import (
    PYTHONPATH,
    checkpoint_bytes,
    host_processes,
    slurm_jobs,
    steps_logged,
    weightstream_run,
)
from tests.params_files import TINY
from tests.waiting import wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

STEPS = 40  # leaves a loaded machine time to strike while the job runs


def params_file(tmp_path: Path) -> Path:
    p = copy.deepcopy(TINY)
    p.pop("eval_input")
    p["runconfig"].update(
        max_steps=STEPS,
        num_csx=2,
        num_wgt_servers=2,
        memoryx_replicas=1,
        recovery_snapshot_steps=0,  # no snapshot: a replayed step would have to start from the seed
        checkpoint_steps=0,
        log_steps=1,
        rpc_timeout_s=30.0,  # a lost host's calls fail at once: the deadline bounds only the roles' start
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def test_a_lost_memoryx_host_fails_over_and_its_roles_move_bitwise(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    params, model_dir, logs = params_file(tmp_path), tmp_path / "slurm", tmp_path / "slurm" / "logs"
    local = weightstream_run(None, params, tmp_path / "local")
    assert local.returncode == 0, local.stderr
    argv = [sys.executable, "-m", "weightstream.cli", "run", str(params), "--num_csx", "2",
            "--model_dir", str(model_dir), "--backend", "slurm"]  # fmt: skip
    env = {**slurm_cluster.env, "PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}
    run = subprocess.Popen(
        slurm_cluster.command(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_until(lambda: run.poll() is not None or steps_logged(model_dir) >= 3, "a third step", 120, 0.2)
        assert run.poll() is None and steps_logged(model_dir) < STEPS - 10, "the job ended before the fault"
        placed = json.loads((logs / "placement.json").read_text())["roles"]
        lost = placed["memoryx-0"]
        roles = sorted(role for role, host in placed.items() if host == lost)
        assert {"memoryx-0", "swarmx-0"} <= set(roles)  # with another shard's replica, on four nodes
        slurm_cluster.hosts.kill(lost)  # every process on it, its slurmd among them
        out, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
    assert run.returncode == 0, out[-3000:]
    for role in roles:
        assert json.loads((logs / f"{role}.ready.json").read_text())["host"] != lost, role
    assert f"restart {len(roles)}/" in out, out[-3000:]
    assert "fails over to its replica" in (model_dir / "run.log").read_text()
    assert "replaying" not in out  # the replica held the shard's state: no step ran twice
    assert checkpoint_bytes(model_dir, STEPS) == checkpoint_bytes(tmp_path / "local", STEPS)
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}

"""Elastic workers on a real Slurm cluster (four emulated hosts): a 3-worker job
(`runconfig.min_num_csx: 2`) loses a worker's host while the only node free of workers is drained, goes on
with 2 workers, and grows back to 3 once the node is resumed (the node added back): the lost worker comes
back on it at a step boundary. Its losses follow a fault-free 3-worker run's to rounding, and the run's
output and step records show both changes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import PYTHONPATH, host_processes, slurm_jobs
from tests.params_files import TINY
from tests.waiting import wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

STEPS = 500  # long enough, at a tiny model's step time, for the shrink, the resume and the growth
RTOL = 1e-3  # another worker count splits the batch's sums otherwise: equal to rounding, not bit for bit


def params_file(tmp_path: Path) -> Path:
    p = copy.deepcopy(TINY)
    p.pop("eval_input")
    p["train_input"]["batch_size"] = 12  # splits 3 and 2 ways
    p["runconfig"].update(
        max_steps=STEPS,
        num_csx=3,
        min_num_csx=2,
        elastic_wait_s=2.0,
        checkpoint_steps=0,
        log_steps=1,
        rpc_timeout_s=30.0,
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def rows(model_dir: Path) -> list[dict[str, Any]]:
    metrics = model_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r]


def scontrol(cluster: SlurmCluster, *args: str) -> None:
    cluster.run(["scontrol", "update", *args], capture_output=True, text=True, timeout=60, check=True)


def test_a_lost_worker_host_without_a_free_node_shrinks_the_job_and_a_resumed_node_grows_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    params, model_dir = params_file(tmp_path), tmp_path / "slurm"
    local_dir = tmp_path / "local"
    env = {"PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "weightstream.cli", "run", str(params), "--num_csx", "3"]
    local = subprocess.run([*argv, "--model_dir", str(local_dir)], capture_output=True, text=True,
                           timeout=600, check=False, env={**os.environ, **env})  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    run = subprocess.Popen(
        slurm_cluster.command([*argv, "--model_dir", str(model_dir), "--backend", "slurm"]),
        env={**slurm_cluster.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: run.poll() is not None or len(rows(model_dir)) >= 3, "a third step", 120, 0.2)
        assert run.poll() is None, "the job ended before the fault"
        placed = json.loads((model_dir / "logs" / "placement.json").read_text())["roles"]
        worker_nodes = {placed[f"worker-{i}"] for i in range(3)}
        free = sorted(set(placed.values()) - worker_nodes)
        assert len(worker_nodes) == 3 and len(free) == 1, placed  # one node of servers, free of workers
        scontrol(slurm_cluster, f"nodename={free[0]}", "state=drain", "reason=elastic-test")
        lost = placed["worker-1"]
        slurm_cluster.hosts.kill(lost)  # every process on it, its slurmd among them
        wait_until(
            lambda: run.poll() is not None or any(r["workers"] == 2 for r in rows(model_dir)),
            "a step with 2 workers",
            180,
            0.2,
        )
        assert run.poll() is None, "the job ended before it shrank"
        scontrol(slurm_cluster, f"nodename={free[0]}", "state=resume")  # the node added back
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
    assert run.returncode == 0, out[-3000:]
    assert "workers 3 → 2" in out and "workers 2 → 3" in out, out[-3000:]
    counts = [r["workers"] for r in rows(model_dir)]
    assert len(counts) == STEPS and counts[0] == 3 and counts[-1] == 3, counts
    shrunk, grown = counts.index(2), len(counts) - counts[::-1].index(2)
    assert set(counts[shrunk:grown]) == {2} and set(counts[grown:]) == {3}, counts
    ready = json.loads((model_dir / "logs" / "worker-1.ready.json").read_text())
    assert ready["host"] == free[0]  # the lost worker came back on the node that was added back
    fault_free = {r["step"]: r["loss"] for r in rows(local_dir)}
    for r in rows(model_dir):
        assert r["loss"] == pytest.approx(fault_free[r["step"]], rel=RTOL), r["step"]
    assert slurm_jobs(slurm_cluster) == [] and host_processes(slurm_cluster) == {}

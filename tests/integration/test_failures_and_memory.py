"""What must not happen: a worker whose memory grows with depth, a hung job, a process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.integration.appliance import TINY, metrics, run, sigint_at_default, weightstream_cmd, write_params
from tests.waiting import wait_until


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _role_pids(model_dir: Path, standby: bool = True) -> dict[str, int]:
    """The pid of every process that has written a ready file: the job's roles and (``standby``) the
    standby processes the local backend keeps once the roles are configured."""
    return {
        f.name.removesuffix(".ready.json"): json.loads(f.read_text())["pid"]
        for f in (model_dir / "logs").glob("*.ready.json")
        if standby or not f.name.startswith("standby-")
    }


def _start_long_run(tmp_path: Path, **runconfig: object) -> tuple[subprocess.Popen[str], Path]:
    params = write_params(tmp_path, max_steps=100000, num_csx=2, log_steps=1, **runconfig)
    model_dir = tmp_path / "m"
    proc = subprocess.Popen(
        [*weightstream_cmd(), "run", str(params), "--model_dir", str(model_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_at_default,
    )

    def training() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"run ended early: {proc.communicate()}")
        f = model_dir / "metrics.jsonl"
        return f.exists() and len(f.read_text().splitlines()) >= 3

    try:
        wait_until(training, "the run to be really training (three lines of metrics)", 90, poll_s=0.1)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        raise
    return proc, model_dir


@pytest.mark.parametrize("victim", ["worker-1", "memoryx-0", "swarmx-0"])
def test_a_role_lost_past_the_restart_budget_fails_the_job_fast_and_leaves_nothing(
    tmp_path: Path, victim: str
) -> None:
    """With no replacements allowed (runconfig.max_role_restarts 0) a dead role fails the job at once,
    naming it and how it died, with the run's fault history; no process is left behind."""
    proc, model_dir = _start_long_run(tmp_path, max_role_restarts=0)
    try:
        roles = _role_pids(model_dir, standby=False)
        assert len(roles) == 6  # 2 memoryx, 1 swarmx, 1 activation, 2 workers
        t0 = time.monotonic()
        os.kill(roles[victim], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not end within 30s of a role's death")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    pids = {**_role_pids(model_dir), **roles}  # the standby processes started meanwhile too
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1
    assert victim in stderr and "SIGKILL" in stderr, stderr
    assert "runconfig.max_role_restarts (0)" in stderr and "faults of this run:" in stderr, stderr
    assert elapsed < 15, f"took {elapsed:.1f}s to notice"
    wait_until(
        lambda: not any(_alive(pid) for pid in pids.values()),
        lambda: f"every role to end ({[n for n, pid in pids.items() if _alive(pid)]} are running)",
        10,
    )
    assert "job failed" in (model_dir / "run.log").read_text()


def test_roles_exit_when_the_coordinator_is_killed(tmp_path: Path) -> None:
    proc, model_dir = _start_long_run(tmp_path)
    pids = _role_pids(model_dir)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    wait_until(
        lambda: not any(_alive(p) for p in pids.values()),
        lambda: f"the roles to follow their coordinator ({[n for n, p in pids.items() if _alive(p)]} run on)",
        15,
        poll_s=0.2,
    )


def test_sigint_stops_every_role(tmp_path: Path) -> None:
    proc, model_dir = _start_long_run(tmp_path)
    pids = _role_pids(model_dir)
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=60)  # a few seconds when the machine is idle
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the run did not stop within 60 s of SIGINT")
    assert proc.returncode == 130 and "interrupted" in stderr
    assert [n for n, pid in pids.items() if _alive(pid)] == []
    for log in (model_dir / "logs").glob("*.log"):  # each stopped by itself, not by its exit deadline
        assert "exiting now" not in log.read_text(), log.name


# ~12 s: two depths trained and measured
@pytest.mark.slow
def test_worker_memory_does_not_grow_with_depth(tmp_path: Path) -> None:
    """A worker holds one unit (plus the prefetched next), never the model: 16 layers vs 2 layers at the
    same width differ by ~44 MiB of weights, but the worker's peak memory barely moves."""
    peaks, model_bytes = {}, {}
    for layers in (2, 16):
        p = json.loads(json.dumps(TINY))
        p.pop("eval_input")
        p["model"].update(hidden_size=256, num_heads=4, filter_size=1024, num_hidden_layers=layers)
        p["train_input"].update(batch_size=2)
        p["runconfig"].update(max_steps=4, worker_memory_mb=8, num_wgt_servers=2)  # 4: past allocator warm-up
        path = tmp_path / f"p{layers}.yaml"
        path.write_text(yaml.safe_dump(p))
        r = run(path, tmp_path / f"m{layers}")
        assert r.returncode == 0, r.stderr
        rows = [
            json.loads(line) for line in (tmp_path / f"m{layers}" / "metrics.jsonl").read_text().splitlines()
        ]
        peaks[layers] = max(row["worker_peak_rss_bytes"] for row in rows if "worker_peak_rss_bytes" in row)
        model_bytes[layers] = sum(
            f.stat().st_size for f in (tmp_path / f"m{layers}" / "checkpoint_4").glob("model*")
        )
        assert metrics(tmp_path / f"m{layers}")[0]
    growth = peaks[16] - peaks[2]
    weights_growth = model_bytes[16] - model_bytes[2]
    block = weights_growth / 14
    assert weights_growth > 40 << 20
    # The streaming pipeline holds a bounded number of units at once (the one computing, the next one
    # arriving as message bytes and as its array, one unit's gradients, one push being serialised): at
    # most 5, whatever the depth. A 2-layer model never fills it, 16 layers do; holding the model would
    # cost 14 more blocks.
    assert growth < 5 * block, (
        f"worker peak grew {growth / 2**20:.1f} MiB; one block is {block / 2**20:.1f} MiB"
    )

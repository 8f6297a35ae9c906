"""Fault recovery, as a user meets it: `weightstream run` while roles are killed or stopped under it.

The chaos test kills a process of every role kind (MemoryX twice: before any recovery snapshot or
checkpoint exists, and later) and SIGSTOPs a worker for good; the job must finish by itself with a final
checkpoint bitwise equal to a fault-free run of the same params and the same losses, step for step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import yaml
from safetensors.numpy import load_file

from tests.integration.appliance import TINY, weightstream_cmd

STEPS = 120


def _params(tmp: Path, **runconfig: Any) -> Path:
    p = json.loads(json.dumps(TINY))
    p["runconfig"].update(
        {
            "max_steps": STEPS,
            "num_csx": 2,
            "num_wgt_servers": 2,
            "log_steps": 1,
            "checkpoint_steps": 60,
            "recovery_snapshot_steps": 10,
            "rpc_timeout_s": 8.0,  # how long a SIGSTOPped role goes unnoticed
            **runconfig,
        }
    )
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _start(params: Path, model_dir: Path) -> subprocess.Popen[str]:
    cmd = [*weightstream_cmd(), "run", str(params), "--model_dir", str(model_dir)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _steps_logged(model_dir: Path) -> int:
    f = model_dir / "metrics.jsonl"
    if not f.exists():
        return 0
    return sum(1 for line in f.read_text().splitlines() if '"loss"' in line)


def _pid(model_dir: Path, role: str) -> int:
    return int(json.loads((model_dir / "logs" / f"{role}.ready.json").read_text())["pid"])


def _losses(model_dir: Path) -> list[tuple[int, Any, Any]]:
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval_loss")) for r in records]


def _assert_bitwise_equal(a: Path, b: Path) -> None:
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in b.glob("*.safetensors"))
    for name in files:
        x, y = load_file(a / name), load_file(b / name)
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), f"{name}: {k} differs"


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fault_free")
    proc = _start(_params(tmp), tmp / "m")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return tmp / "m"


# (step at which to strike, role, signal): every kind; MemoryX first before any snapshot exists
SCHEDULE = [
    (4, "memoryx-0", signal.SIGKILL),
    (22, "worker-1", signal.SIGKILL),
    (38, "swarmx-0", signal.SIGKILL),
    (54, "activation-0", signal.SIGKILL),
    (75, "memoryx-1", signal.SIGKILL),
    (95, "worker-0", signal.SIGSTOP),  # never resumed: found by the deadline, killed and replaced
]


@pytest.mark.slow  # ~35 s: two 120-step runs
def test_a_job_survives_the_loss_of_every_kind_of_role_bitwise(tmp_path: Path, fault_free: Path) -> None:
    model_dir = tmp_path / "m"
    proc = _start(_params(tmp_path), model_dir)
    struck: list[int] = []
    try:
        for step, role, sig in SCHEDULE:
            deadline = time.monotonic() + 120
            while _steps_logged(model_dir) < step:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, f"no progress to step {step}"
                time.sleep(0.01)
            pid = _pid(model_dir, role)
            os.kill(pid, sig)
            struck.append(pid)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    # each fault is a line of the progress output and of run.log, naming the role and how it died
    for _, role, sig in SCHEDULE:
        how = "SIGKILL" if sig == signal.SIGKILL else "hung"
        assert any(role in line and how in line for line in out.splitlines() if "restart" in line), out
    assert "restart 6/50" in out and "recovered in" in out
    run_log = (model_dir / "run.log").read_text()
    assert run_log.count("replacing it") == len(SCHEDULE)
    assert "replaying 4 steps from step 0" in run_log  # the first MemoryX loss: back to the seed's state
    # the end result: bitwise the fault-free run's checkpoint, and the same losses with no step twice
    _assert_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert _losses(model_dir) == _losses(fault_free)
    assert not list(model_dir.glob(".recovery_*")), "recovery snapshots are scratch, removed at the end"
    time.sleep(0.5)
    alive = [p for p in struck if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == [], "the stopped worker was left behind"


@pytest.mark.slow  # ~15 s, beside the chaos test's fault-free run
def test_roles_told_to_stop_with_sigterm_are_replaced_bitwise(tmp_path: Path, fault_free: Path) -> None:
    """SIGTERM (a pod evicted or deleted, a service manager stopping a unit) is a graceful stop: the role
    refuses new calls, lets its calls in flight end for a second, cancels the rest and exits 143 (128 +
    SIGTERM) while its peers are mid-step. The job replaces it and ends bitwise where a fault-free run
    does."""
    model_dir = tmp_path / "m"
    proc = _start(_params(tmp_path), model_dir)
    stopped = [(30, "memoryx-1"), (70, "worker-0")]
    try:
        for step, role in stopped:
            deadline = time.monotonic() + 120
            while _steps_logged(model_dir) < step:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, f"no progress to step {step}"
                time.sleep(0.01)
            os.kill(_pid(model_dir, role), signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    for _, role in stopped:
        assert any(role in line and "stopped on SIGTERM" in line for line in out.splitlines()), out
    assert (model_dir / "run.log").read_text().count("replacing it") == len(stopped)
    _assert_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert _losses(model_dir) == _losses(fault_free)


def test_a_replacement_whose_data_is_gone_fails_the_job_instead_of_looping(tmp_path: Path) -> None:
    """A data error is no fault a new process can cure: the replaced activation server cannot read its
    data, so the job fails, naming it, with the run's fault history."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    p = yaml.safe_load(_params(tmp_path, max_steps=100000).read_text())
    p["model"]["vocab_size"] = 256
    for split in ("train_input", "eval_input"):
        p[split] = {**p[split], "data_processor": "TextFileDataProcessor", "data_dir": str(data)}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(p))
    model_dir = tmp_path / "m"
    proc = _start(params, model_dir)
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(model_dir) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        (data / "a.txt").unlink()
        os.kill(_pid(model_dir, "activation-0"), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    flat = " ".join(err.split())
    assert "could not be configured again after replacing activation-0" in flat, err
    assert "no *.txt files" in flat and "faults of this run:" in flat, err

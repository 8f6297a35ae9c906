"""A `weightstream run` to strike faults at, and what a test reads of it: the steps it logged, a role's pid,
its losses, when run.log says something, whether two runs' checkpoints are bitwise the same, and which of its
processes still run."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from safetensors.numpy import load_file

from tests.integration.appliance import weightstream_cmd
from tests.waiting import wait_until


def start_run(params: Path, model_dir: Path) -> subprocess.Popen[str]:
    cmd = [*weightstream_cmd(), "run", str(params), "--model_dir", str(model_dir)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def steps_logged(model_dir: Path) -> int:
    f = model_dir / "metrics.jsonl"
    if not f.exists():
        return 0
    return sum(1 for line in f.read_text().splitlines() if '"loss"' in line)


def steps_logged_while_running(proc: subprocess.Popen[str], model_dir: Path) -> int:
    """``steps_logged``, failing the test if the run has ended: for a wait on the run's progress."""
    assert proc.poll() is None, proc.communicate()
    return steps_logged(model_dir)


def wait_for_step(proc: subprocess.Popen[str], model_dir: Path, step: int, timeout: float = 120) -> None:
    """Return once the run has logged ``step`` steps; fail the test if it ends first or takes ``timeout``."""
    wait_until(lambda: steps_logged_while_running(proc, model_dir) >= step, f"step {step}", timeout)


def ready_pid(path: Path) -> int:
    """The pid a ready file names: the process that serves its role (or, ``standby-*``, a spare)."""
    return int(json.loads(path.read_text())["pid"])


def role_pid(model_dir: Path, role: str) -> int:
    return ready_pid(model_dir / "logs" / f"{role}.ready.json")


def still_running(pids: set[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie has ended: only its parent has not reaped it yet)."""
    left = []
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def run_log_line(model_dir: Path, text: str) -> tuple[float, str]:
    """The first line of the run's run.log that holds ``text``, with when it was logged (seconds since
    the epoch, as ``time.time()``; run.log's times are local and to the millisecond)."""
    for line in (model_dir / "run.log").read_text().splitlines():
        if text in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp(), line
    raise AssertionError(f"no line of {model_dir / 'run.log'} holds {text!r}")


def logged_losses(model_dir: Path) -> list[tuple[int, Any, Any]]:
    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval_loss")) for r in records]


def assert_checkpoints_bitwise_equal(a: Path, b: Path) -> None:
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in b.glob("*.safetensors"))
    for name in files:
        x, y = load_file(a / name), load_file(b / name)
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), f"{name}: {k} differs"


def run_striking(
    params: Path, model_dir: Path, strikes: Sequence[tuple[int, str, int]]
) -> tuple[str, list[int]]:
    """A `weightstream run` of ``params`` that sends, once it has logged step ``step``, ``signal`` to the
    process of ``role`` (its ready file's pid), for each of ``strikes``; fails the test unless the run ends
    well. Returns its progress output and the pids struck."""
    proc = start_run(params, model_dir)
    struck: list[int] = []
    try:
        for step, role, sig in strikes:
            wait_for_step(proc, model_dir, step)
            pid = role_pid(model_dir, role)
            os.kill(pid, sig)
            struck.append(pid)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return out, struck

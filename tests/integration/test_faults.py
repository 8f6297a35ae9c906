"""Fault recovery, as a user meets it: `weightstream run` while roles are killed or stopped under it.

The chaos test kills a process of every role kind (MemoryX twice: before any recovery snapshot or
checkpoint exists, and later) and SIGSTOPs a worker for good; the job must finish by itself with a final
checkpoint bitwise equal to a fault-free run of the same params and the same losses, step for step. A
SIGSTOPped role is found by its heartbeats, within seconds, whatever the calls' deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.integration.appliance import TINY
from tests.integration.faults import (
    assert_checkpoints_bitwise_equal,
    logged_losses,
    ready_pid,
    role_pid,
    run_log_line,
    run_striking,
    start_run,
    steps_logged_while_running,
    still_running,
    wait_for_step,
)
from tests.waiting import wait_until

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
            "rpc_timeout_s": 8.0,  # bounds any wait; a SIGSTOPped role is found by its heartbeats first
            **runconfig,
        }
    )
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fault_free")
    proc = start_run(_params(tmp), tmp / "m")
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
    (95, "worker-0", signal.SIGSTOP),  # never resumed: found by its heartbeats, killed and replaced
]


@pytest.mark.slow  # ~35 s: two 120-step runs
def test_a_job_survives_the_loss_of_every_kind_of_role_bitwise(tmp_path: Path, fault_free: Path) -> None:
    model_dir = tmp_path / "m"
    out, struck = run_striking(_params(tmp_path), model_dir, SCHEDULE)
    # each fault is a line of the progress output and of run.log, naming the role and how it died
    for _, role, sig in SCHEDULE:
        how = "SIGKILL" if sig == signal.SIGKILL else "hung"
        assert any(role in line and how in line for line in out.splitlines() if "restart" in line), out
    assert "restart 6/50" in out and "recovered in" in out
    run_log = (model_dir / "run.log").read_text()
    assert run_log.count("replacing it") == len(SCHEDULE)
    assert "replaying 4 steps from step 0" in run_log  # the first MemoryX loss: back to the seed's state
    # the end result: bitwise the fault-free run's checkpoint, and the same losses with no step twice
    assert_checkpoints_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert logged_losses(model_dir) == logged_losses(fault_free)
    assert not list(model_dir.glob(".recovery_*")), "recovery snapshots are scratch, removed at the end"

    # the stopped worker among them: killed by the run, not left behind
    left = partial(still_running, set(struck))
    wait_until(lambda: not left(), lambda: f"every struck role to be gone ({left()} are not)", 10)


@pytest.mark.slow  # ~25 s, beside the chaos test's fault-free run
def test_with_replicas_a_lost_memoryx_shard_replays_no_step(tmp_path: Path, fault_free: Path) -> None:
    """``memoryx_replicas: 1`` and no recovery snapshots: a shard whose process is killed fails over to its
    replica, a killed replica is built again, and no step is ever replayed (without replicas, each loss
    here would roll back to the seed's state or the step-60 checkpoint). The result is bitwise the
    fault-free run's, which had no replicas: a replica changes nothing in the numbers."""
    model_dir = tmp_path / "m"
    params = _params(tmp_path, memoryx_replicas=1, recovery_snapshot_steps=0)
    # (step, process): shard 0's own, then shard 1's replica, then the process serving shard 0 after its
    # failover, the one started as its replica
    strikes = [(10, "memoryx-0"), (30, "memoryx-replica-1"), (50, "memoryx-replica-0")]
    out, _ = run_striking(params, model_dir, [(step, role, signal.SIGKILL) for step, role in strikes])
    run_log = (model_dir / "run.log").read_text()
    assert run_log.count("replacing it") == len(strikes)
    assert run_log.count("memoryx-0 fails over to its replica") == 2, run_log
    recovered = [line for line in run_log.splitlines() if "recovered in" in line]
    assert len(recovered) == len(strikes) and all("replaying 0 steps" in line for line in recovered), (
        recovered
    )
    # the progress output names the host each process was lost on, and what each recovery did
    host = socket.gethostname()
    assert out.count(f"(host {host})") == len(strikes), out
    assert out.count("memoryx-0 failed over to its replica; rebuilt the replica of memoryx-0") == 2, out
    assert "rebuilt the replica of memoryx-1" in out, out
    assert_checkpoints_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert logged_losses(model_dir) == logged_losses(fault_free)


@pytest.mark.slow  # ~20 s, beside the chaos test's fault-free run
def test_a_hung_worker_is_found_by_its_heartbeats_and_replaced_within_3s_bitwise(
    tmp_path: Path, fault_free: Path
) -> None:
    """A worker SIGSTOPped for good mid-run, with calls' deadline at 60 s: only its heartbeats
    (runconfig.heartbeat_timeout_s, 2 s) can find it within 3 s. It is replaced, named with the time since
    its last answer, and the job ends bitwise where a fault-free run does."""
    model_dir = tmp_path / "m"
    proc = start_run(_params(tmp_path, rpc_timeout_s=60.0), model_dir)
    try:
        wait_for_step(proc, model_dir, 40)
        pid = role_pid(model_dir, "worker-1")
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    replaced_at, line = run_log_line(model_dir, "replacing it")
    assert re.search(r"worker-1 did not answer heartbeats for \d+\.\ds \(hung\); killed", line), line
    assert replaced_at - stopped_at < 3.0, f"replaced {replaced_at - stopped_at:.2f}s after the stop: {line}"
    assert any("restart 1/50" in x and "worker-1" in x and "hung" in x for x in out.splitlines()), out
    assert_checkpoints_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert logged_losses(model_dir) == logged_losses(fault_free)

    def left_behind() -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_until(lambda: not left_behind(), f"the stopped worker (pid {pid}) to be gone", 10)


@pytest.mark.slow  # ~15 s, beside the chaos test's fault-free run
def test_roles_told_to_stop_with_sigterm_are_replaced_bitwise(tmp_path: Path, fault_free: Path) -> None:
    """SIGTERM (a pod evicted or deleted, a service manager stopping a unit) is a graceful stop: the role
    refuses new calls, lets its calls in flight end for a second, cancels the rest and exits 143 (128 +
    SIGTERM) while its peers are mid-step. The job replaces it and ends bitwise where a fault-free run
    does."""
    model_dir = tmp_path / "m"
    stopped = [(30, "memoryx-1"), (70, "worker-0")]
    out, _ = run_striking(
        _params(tmp_path), model_dir, [(step, role, signal.SIGTERM) for step, role in stopped]
    )
    for _, role in stopped:
        assert any(role in line and "stopped on SIGTERM" in line for line in out.splitlines()), out
    assert (model_dir / "run.log").read_text().count("replacing it") == len(stopped)
    assert_checkpoints_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert logged_losses(model_dir) == logged_losses(fault_free)


def _spare_files(proc: subprocess.Popen[str], logs: Path, kind: str) -> list[Path]:
    """The ready files of ``kind``'s spares, failing the test if the run has ended: for a wait."""
    assert proc.poll() is None, proc.communicate()
    return sorted(logs.glob(f"standby-{kind}-*.ready.json"))


def _serving(model_dir: Path, role: str) -> int | None:
    """The pid ``role``'s ready file names; None while it has none (a new process is starting)."""
    try:
        return role_pid(model_dir, role)
    except FileNotFoundError:
        return None


@pytest.mark.slow  # ~20 s, beside the chaos test's fault-free run
def test_a_killed_worker_is_handed_to_its_standby_process(tmp_path: Path, fault_free: Path) -> None:
    """``runconfig.standby_roles`` (default 1): once the job's roles are ready, a started, unconfigured
    process of each kind waits. A SIGKILLed worker is handed to the worker spare: worker-1's ready file is
    then the one the spare wrote before the fault, naming its pid; a new spare starts in the background;
    the job ends bitwise where a fault-free run does, and leaves no process, role or spare, behind."""
    model_dir = tmp_path / "m"
    logs = model_dir / "logs"
    proc = start_run(_params(tmp_path), model_dir)
    try:
        wait_until(lambda: _spare_files(proc, logs, "worker"), "a ready worker spare", 120)
        [spare] = _spare_files(proc, logs, "worker")
        spare_pid = ready_pid(spare)
        wait_for_step(proc, model_dir, 10)
        killed = role_pid(model_dir, "worker-1")
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: _serving(model_dir, "worker-1") == spare_pid, "worker-1 served by the spare", 60)
        assert not spare.exists()  # moved: it is worker-1's now
        wait_until(lambda: _spare_files(proc, logs, "worker"), "a new worker spare", 120)
        running = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert any("worker-1" in line and "SIGKILL" in line for line in out.splitlines() if "restart" in line), (
        out
    )
    assert role_pid(model_dir, "worker-1") == spare_pid
    assert (
        f"worker-1 is now served by {spare.name.removesuffix('.ready.json')} (pid {spare_pid})"
        in (logs / "worker-1.log").read_text()
    )
    assert_checkpoints_bitwise_equal(model_dir / f"checkpoint_{STEPS}", fault_free / f"checkpoint_{STEPS}")
    assert logged_losses(model_dir) == logged_losses(fault_free)
    # every process the run started: those running near its end, and those its ready files name
    pids = running | {ready_pid(f) for f in logs.glob("*.ready.json")} | {killed}
    assert spare_pid in running and len(running) > 6  # 6 roles and at least one spare
    left = partial(still_running, pids)
    wait_until(lambda: not left(), lambda: f"every process of the run gone ({left()} are not)", 10)


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
    proc = start_run(params, model_dir)
    try:
        wait_until(lambda: steps_logged_while_running(proc, model_dir) >= 3, "step 3", 120)
        (data / "a.txt").unlink()
        os.kill(role_pid(model_dir, "activation-0"), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    flat = " ".join(err.split())
    assert "could not be configured again after replacing activation-0" in flat, err
    assert "no *.txt files" in flat and "faults of this run:" in flat, err

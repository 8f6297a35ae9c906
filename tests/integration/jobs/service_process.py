"""`weightstream serve` as a real process on a loopback port (``Service``), and what the tests of the jobs
it runs read and clean up: a job's params, its roles' pids, its logged steps and checkpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.integration.appliance import TINY, weightstream_cmd
from tests.waiting import wait_until
from weightstream_client import Client

TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, data_dir: Path, slots: int, *args: str) -> None:
        """``args``: more `serve` options (limits, data roots)."""
        self.data_dir, self.slots, self.args = data_dir, slots, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.clients: list[Client] = []

    def start(self) -> Service:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "WEIGHTSTREAM_TOKEN": TOKEN}
        log = open(self.data_dir.parent / f"serve-{port}.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.grpc_port = free_port()
        self.proc = subprocess.Popen(
            [
                *weightstream_cmd(),
                "serve",
                "--port",
                str(port),
                "--grpc-port",
                str(self.grpc_port),
                "--data-dir",
                str(self.data_dir),
                "--slots",
                str(self.slots),
                *self.args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(lambda: self._healthy(port), "serve to become healthy")
        return self

    def _healthy(self, port: int) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"serve exited: {(self.data_dir.parent / f'serve-{port}.log').read_text()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> Client:
        c = Client(self.url, TOKEN)
        self.clients.append(c)
        return c


def job_params(**runconfig: Any) -> dict[str, Any]:
    p = json.loads(json.dumps(TINY))
    p["runconfig"].update(runconfig)
    return p


def role_pids(model_dir: Path) -> list[int]:
    return [json.loads(f.read_text())["pid"] for f in (model_dir / "logs").glob("*.ready.json")]


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """``wait_until`` at the pace of these tests: each look is a request to the service or a read of a
    job's files, so once every 0.1 s."""
    wait_until(cond, what, timeout, poll_s=0.1)


def logged_steps(model_dir: Path) -> list[int]:
    """Train steps in the job's metrics.jsonl so far (a line still being written is skipped)."""
    path = model_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in row:
            steps.append(row["step"])
    return steps


def checkpoint_tensors(checkpoint: Path, prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of ``prefix`` (model or optimizer) in a checkpoint, merged over the shards' files."""
    out: dict[str, np.ndarray] = {}
    for f in sorted(checkpoint.glob(f"{prefix}*.safetensors")):
        out.update(load_file(f))
    return out


def stop_leftovers(pids: set[int], model_dir: Path) -> None:
    """SIGKILL those of ``pids`` still alive that are roles of this job (their command line names its
    model_dir: a recycled pid is left alone). The test's last line of defence, whatever it asserted."""
    import psutil

    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if str(model_dir) in " ".join(proc.cmdline()):
                proc.kill()
        except psutil.Error:
            pass

"""Which data plane a run uses: roles on one host (the local backend) exchange tensors in shared memory,
every pair of them, unless told otherwise; that their results are bitwise those of the network plane is
in test_appliance."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.appliance import weightstream_cmd, write_params


def _memfds(proc: psutil.Process) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{proc.pid}/fd"):
        with contextlib.suppress(OSError):  # an fd closed while we look
            n += os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith("/memfd:weightstream-")
    return n


def _role_memfds(tmp: Path, data_plane: str) -> dict[str, int]:
    """The most weightstream memfds each role kind held at once during a short run."""
    params = write_params(tmp, max_steps=30, data_plane=data_plane)
    cmd = [*weightstream_cmd(), "run", str(params), "--model_dir", str(tmp / "run"), "--num_csx", "1"]
    seen: dict[str, int] = {}
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as run:
        coordinator = psutil.Process(run.pid)
        while run.poll() is None:
            for child in coordinator.children(recursive=True):
                try:
                    kind = next(k for k in ("memoryx", "swarmx", "worker") if k in child.cmdline())
                    seen[kind] = max(seen.get(kind, 0), _memfds(child))
                except (StopIteration, psutil.Error, OSError):
                    pass
            time.sleep(0.05)
        assert run.returncode == 0, run.stderr.read() if run.stderr else ""
    return seen


@pytest.mark.parametrize("data_plane", ["auto", "grpc"])
def test_local_roles_share_memory_unless_told_not_to(tmp_path: Path, data_plane: str) -> None:
    seen = _role_memfds(tmp_path, data_plane)
    assert "memoryx" in seen, "never saw the MemoryX process"
    logs = {f.stem: f.read_text() for f in (tmp_path / "run" / "logs").glob("*.log")}
    if data_plane == "auto":
        # MemoryX keeps every weight it holds in a memfd of its own (the tiny model: 2 shards, >= 2 each)
        assert seen["memoryx"] >= 2
        # and each role that calls another chose shared memory for the pair, having mapped its probe
        assert "data plane to swarmx-0 (127.0.0.1:" in logs["worker-0"]
        for caller, peer in [("worker-0", "swarmx-0"), ("swarmx-0", "memoryx-0"), ("swarmx-0", "memoryx-1")]:
            assert f"data plane to {peer} (" in logs[caller]
            assert "network" not in logs[caller].split(f"data plane to {peer} (")[1].splitlines()[0]
    else:
        # nothing in memfds but each role's probe (transport/peers.py), which no peer asks for
        assert seen == {k: 1 for k in seen}
        assert not any("data plane to" in text for text in logs.values())

"""A role told to stop exits within a bounded time even when one of its gRPC handlers is stuck.

Interpreter exit joins the gRPC server's handler threads; a handler stuck in a wait or a call that its
logic's close does not end (a hung peer, a sum whose other parts never come) kept a stopped role alive
for as long as its wait (120 s by default). A real role process (``serve_role``) whose Configure never
returns is told to stop with SIGTERM: it ends itself at its exit deadline (``role.EXIT_DEADLINE_S`` by
default; 2 s here, to keep the test short), saying so.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from tests.waiting import wait_until
from weightstream.plan import JobSpec
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.auth import new_role_token
from weightstream.transport.rpc import open_channel

STUCK_ROLE = """
import logging, sys, threading
from pathlib import Path
from weightstream.role import serve_role

def build(job):  # a configuration that never finishes: its handler thread is stuck for good
    Path(sys.argv[2]).write_text("building")
    threading.Event().wait()

logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
serve_role(
    "worker", build, lambda role, server: None, ready_file=Path(sys.argv[1]), token=sys.argv[3],
    exit_deadline_s=float(sys.argv[4]),
)
"""


DEADLINE_S = 2.0


def _wait_for(path: Path, proc: subprocess.Popen[str], what: str) -> None:
    """Until the role writes ``path`` (its sign of ``what``); fails if it ends first."""

    def written() -> bool:
        assert proc.poll() is None, proc.communicate()
        return path.exists()

    wait_until(written, what, 30)


def test_a_stopped_role_with_a_stuck_handler_ends_itself(tmp_path: Path) -> None:
    token = new_role_token()
    ready, building = tmp_path / "ready.json", tmp_path / "building"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_ROLE, str(ready), str(building), token, str(DEADLINE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(ready, proc, "listening")
        address = json.loads(ready.read_text())["address"]
        job = JobSpec({}, {}, {}, "worker", 0)
        stub = rpc.ControlStub(open_channel(address, token))
        outcome: list[grpc.StatusCode] = []

        def configure() -> None:
            try:
                stub.Configure(pb.ConfigureRequest(job_json=job.to_json()), timeout=60)
            except grpc.RpcError as e:
                outcome.append(e.code())

        caller = threading.Thread(target=configure, daemon=True)
        caller.start()
        _wait_for(building, proc, "the configuration")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=DEADLINE_S + 20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the stopped role is still running with its handler stuck") from None
        elapsed = time.monotonic() - t0
        assert proc.returncode == 1, stderr
        assert "after being told to stop" in stderr and "exiting now" in stderr, stderr
        assert DEADLINE_S - 1 <= elapsed < DEADLINE_S + 5, (
            f"ended {elapsed:.1f}s after SIGTERM: not its deadline"
        )
        caller.join(10)
        assert outcome and outcome[0] != grpc.StatusCode.OK
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_the_backend_tells_a_role_told_to_stop_from_one_killed(tmp_path: Path) -> None:
    """A role stopped with SIGTERM stops in order and exits 128 + 15; the local backend's report says it
    was told to stop (before, "exited with status 0", which read like a role ending of its own accord),
    while a SIGKILLed one still reads killed. Real role processes, started as a job starts them."""
    from weightstream.backends.base import RoleSpec
    from weightstream.backends.local import LocalProcessBackend

    backend = LocalProcessBackend(tmp_path)
    told, killed = RoleSpec("activation", 0), RoleSpec("swarmx", 0)
    backend.start([told, killed], new_role_token())
    try:
        backend.wait_ready(timeout_s=60)
        backend.procs[told].send_signal(signal.SIGTERM)
        backend.procs[killed].kill()
        assert backend.procs[told].wait(timeout=30) == 128 + signal.SIGTERM
        backend.procs[killed].wait(timeout=30)
        dead = backend.dead()
        assert "activation-0" in dead[told] and "stopped on SIGTERM (exit status 143)" in dead[told]
        assert "was killed by SIGKILL" in dead[killed]
        assert "stopping on SIGTERM" in (tmp_path / "activation-0.log").read_text()
    finally:
        backend.stop()

"""The REST app served for real on loopback, for tests of its edge and fuzzing.

``LiveApi`` serves ``create_app`` with uvicorn in a thread (and, if asked, the gRPC API beside it), over
a real ``JobService`` in a temporary directory whose runners are ``CheckpointingRunner``: each job
"trains" at once, writing what a real run leaves behind (a log, metrics, one complete checkpoint), so
every route has something true to answer with and no role process starts. Tests that decide when jobs
start and end pass runners of their own (``tests.fleet.Fleet``). ``ServeProcess``
runs `weightstream serve` itself, for tests that measure the server process.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

from tests.integration.appliance import TINY, weightstream_cmd
from tests.waiting import wait_until
from weightstream.checkpoint_layout import TRAINER_STATE, checkpoint_dir
from weightstream.jobs.api import create_app
from weightstream.jobs.grpc_api import CoordinatorServer, serve_grpc
from weightstream.jobs.service import JobService, RunnerFactory, ServiceConfig
from weightstream.jobs.store import Job
from weightstream.params import Params
from weightstream.training.events import EventSink
from weightstream.training.runner import RunSummary

__all__ = [
    "CHECKPOINT_FILES",
    "TOKEN",
    "CheckpointingRunner",
    "LiveApi",
    "ServeProcess",
    "ThreadedServer",
    "free_port",
]

TOKEN = "edge-token-0123456789"
# a checkpoint's files and their contents; "notes #1.txt" needs URL quoting on the way to the server
CHECKPOINT_FILES = {
    "model.safetensors": b"\x00weights" * 64,
    TRAINER_STATE: b'{"global_step": 1}',
    "notes #1.txt": b"a name with a space and a hash",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class CheckpointingRunner:
    """Succeeds at once, leaving a log, one step of metrics and checkpoint_1 in the job's model_dir."""

    def __init__(self, job: Job, params: Params, on_event: EventSink) -> None:
        self.model_dir = Path(job.model_dir)

    def run(self) -> RunSummary:
        d = checkpoint_dir(self.model_dir, 1)
        d.mkdir(parents=True, exist_ok=True)
        for name, data in CHECKPOINT_FILES.items():
            if name != TRAINER_STATE:
                (d / name).write_bytes(data)
        (d / TRAINER_STATE).write_bytes(CHECKPOINT_FILES[TRAINER_STATE])  # last: marks it complete
        (self.model_dir / "run.log").write_text("step 1 loss 4.1\ncheckpoint 1 saved\n")
        row = {"step": 1, "loss": 4.1, "tokens_per_second": 1000.0}
        (self.model_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        return RunSummary(1, 0, 1, 4.1, None, None, 0.0)

    def cancel(self) -> None:
        pass

    def stop(self) -> None:
        pass


class ThreadedServer:
    """An ASGI app served by uvicorn on a loopback port, in a thread; a context manager."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self.thread.start()

        def started() -> bool:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn's thread ended before it started serving")
            return bool(self.server.started)

        wait_until(started, "uvicorn to start", 30)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class LiveApi:
    """``create_app`` over a ``JobService`` of ``CheckpointingRunner`` jobs (or ``runners``), served on a
    loopback port; with ``grpc``, the gRPC API too, at ``grpc_address``. A context manager: stops the
    servers and the service on exit."""

    def __init__(
        self,
        data_dir: Path,
        slots: int = 2,
        runners: RunnerFactory = CheckpointingRunner,
        user_name: str = "",
        grpc: bool = False,
    ) -> None:
        config = ServiceConfig(data_dir=data_dir, slots=slots, user_name=user_name)
        self.service = JobService(config, runners)
        self._server = ThreadedServer(create_app(self.service, TOKEN))
        self._grpc = grpc
        self._grpc_server: CoordinatorServer | None = None
        self.url = self.grpc_address = ""

    def __enter__(self) -> Self:
        try:
            self.url = self._server.__enter__().url
            if self._grpc:
                self._grpc_server, port = serve_grpc(self.service, TOKEN, "127.0.0.1:0")
                self.grpc_address = f"127.0.0.1:{port}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=0)
        self._server.__exit__(*exc)
        self.service.shutdown()

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)

    def finished_job(self) -> Job:
        """A job that has run to success, with its checkpoint written."""
        job = self.service.submit(copy.deepcopy(TINY), 1, {"made_by": "live_api"})
        wait_until(
            lambda: self.service.is_terminal(job.id),
            lambda: f"job {job.id} to end (still {self.service.store.get(job.id).status})",
            30,
        )
        return self.service.store.get(job.id)


class ServeProcess:
    """`weightstream serve` as a real process on loopback ports; ``pid`` is the server's own process."""

    def __init__(self, data_dir: Path, log: Path, *args: str) -> None:
        """``args``: more `serve` options."""
        port = free_port()
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        cmd = [*weightstream_cmd(), "serve", "--port", str(port), "--grpc-port", str(free_port())]
        cmd += ["--data-dir", str(data_dir), "--slots", "1", *args]
        with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd, env={**os.environ, "WEIGHTSTREAM_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT
            )
        self.pid, self.log = self.proc.pid, log

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {log.read_text()}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(healthy, lambda: f"serve to become healthy: {log.read_text()}", 60, poll_s=0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

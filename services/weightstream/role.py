"""A role process: one gRPC server with the Control service and the role's own service.

The process starts unconfigured with the job's role token (``transport.auth``: every call but Health must
carry it), writes ``{"address", "pid"}`` to its ready file once it listens, and builds its logic when the
coordinator's Configure call hands it the job. It exits on Shutdown, on
SIGTERM, and when its parent (the coordinator) is gone, so a crashed coordinator leaves no orphan.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from weightstream.plan import JobSpec
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.storage_io import write_text_durably
from weightstream.transport.auth import RoleAuthInterceptor, has_credential
from weightstream.transport.rpc import abort_on_error, create_server

__all__ = ["RoleHost", "serve_role"]

log = logging.getLogger("weightstream.role")


class RoleHost:
    """Holds the role's logic once configured; servicers reach it through ``logic(context)``."""

    def __init__(self, kind: str, build: Callable[[JobSpec], Any], token: str) -> None:
        self.kind, self._build, self.token = kind, build, token
        self.job: JobSpec | None = None
        self._logic: Any = None
        self.stopped = threading.Event()

    def configure(self, job: JobSpec) -> None:
        if job.role != self.kind:
            raise ValueError(f"this process is a {self.kind}, not a {job.role}")
        job = replace(job, credential=self.token)  # for the calls this role makes to the others
        self._logic = self._build(job)
        self.job = job

    def logic(self, context: grpc.ServicerContext) -> Any:
        if self._logic is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.kind} is not configured yet")
        return self._logic

    def close(self) -> None:
        closer = getattr(self._logic, "close", None)
        if closer is not None:
            closer()


class ControlServicer(rpc.ControlServicer):
    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def Health(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.HealthReply:
        """Answers anyone (it is the probe of pods and containers); only a caller with the job's
        credential learns more than "serving"."""
        if not has_credential(context.invocation_metadata(), self.host.token):
            return pb.HealthReply()
        job = self.host.job
        return pb.HealthReply(
            role=self.host.kind, pid=os.getpid(), configured=job is not None, index=job.index if job else -1
        )

    def Configure(self, request: pb.ConfigureRequest, context: grpc.ServicerContext) -> pb.Ack:
        try:
            self.host.configure(JobSpec.from_json(request.job_json))
        except Exception as e:  # any failure to build the role is reported to the coordinator
            log.exception("configure failed")
            abort_on_error(context, e)
        return pb.Ack(message=f"{self.host.kind} configured")

    def Shutdown(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.Ack:
        self.host.stopped.set()
        return pb.Ack(message="shutting down")


def _watch_parent(parent_pid: int, stopped: threading.Event) -> None:
    while not stopped.wait(0.5):
        if os.getppid() != parent_pid:
            log.error("parent process %d is gone; shutting down", parent_pid)
            stopped.set()


def serve_role(
    kind: str,
    build: Callable[[JobSpec], Any],
    add_servicer: Callable[[RoleHost, grpc.Server], None],
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: Path | None = None,
    parent_pid: int | None = None,
    *,
    token: str,
) -> None:
    """Run a role until it is told to stop. ``port=0`` picks a free port (reported in the ready file);
    ``token`` is the job's role credential, required on every call but Health."""
    role = RoleHost(kind, build, token)

    def register(server: grpc.Server) -> None:
        rpc.add_ControlServicer_to_server(ControlServicer(role), server)
        add_servicer(role, server)

    server, bound = create_server(f"{host}:{port}", register, interceptors=[RoleAuthInterceptor(token)])
    signal.signal(signal.SIGTERM, lambda *_: role.stopped.set())
    signal.signal(signal.SIGINT, lambda *_: role.stopped.set())
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid, role.stopped), daemon=True).start()
    if ready_file is not None:
        write_text_durably(ready_file, json.dumps({"address": f"{host}:{bound}", "pid": os.getpid()}))
    log.info("%s listening on %s:%d", kind, host, bound)
    role.stopped.wait()
    server.stop(grace=1.0).wait(timeout=5)
    role.close()
    time.sleep(0.05)

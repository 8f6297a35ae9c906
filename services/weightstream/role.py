"""A role process: one gRPC server with the Control service and the role's own service.

The process starts unconfigured with the job's role token (``transport.auth``: every call but Health must
carry it), writes ``{"address", "host", "pid"}`` to its ready file once it listens, and builds its logic
when the coordinator's Configure call hands it the job. A later Configure (the coordinator recovering from
a fault) replaces the logic with one built for the new configuration, or lets the role keep its state where it
has a ``reconfigure`` hook (MemoryX), under a new generation: calls of any other generation are refused
(``transport.fencing``). It exits on Shutdown, on
SIGTERM, and when the coordinator is gone, so a crashed coordinator leaves no orphan: its parent changed
(a process the coordinator started itself), or its standard input closed (a Slurm step, whose parent is
``slurmstepd``: the coordinator holds the write end of a pipe srun forwards, which closes with it however
it dies).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
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
from weightstream.transport import bulk
from weightstream.transport.auth import RoleAuthInterceptor, has_credential
from weightstream.transport.fencing import StaleGenerationError, check_generation, generation_of
from weightstream.transport.peers import MemfdProbe
from weightstream.transport.rpc import abort_on_error, create_server
from weightstream.transport.shm import job_tag

__all__ = ["RoleHost", "serve_role", "shm_tag"]

log = logging.getLogger("weightstream.role")


Reconfigure = Callable[[Any, JobSpec], Any | None]

# How long a role may take to exit once told to stop (server stop, closing its logic, interpreter exit)
# before it ends itself: interpreter exit joins the gRPC handler threads, and one stuck in a wait or a call
# (a peer that hangs, a sum whose other parts never come) must not keep a stopped role, and its memory, on.
EXIT_DEADLINE_S = 8.0


def shm_tag(job: JobSpec | None) -> str | None:
    """The tag of ``job``'s memfds when its roles may exchange tensors in shared memory, each pair where
    it can (transport/peers.py); None when every byte goes over the network."""
    return job_tag(job.credential) if job is not None and job.shared_memory and job.credential else None


def _close(logic: Any) -> None:
    closer = getattr(logic, "close", None)
    if closer is not None:
        closer()


class RoleHost:
    """Holds the role's logic once configured; servicers reach it through ``logic(context)``.

    ``reconfigure(old_logic, job)``, where given, is tried first on a later Configure: it returns the logic
    to keep (adapted to ``job``), or None to build a new one."""

    def __init__(
        self,
        kind: str,
        build: Callable[[JobSpec], Any],
        token: str,
        reconfigure: Reconfigure | None = None,
        probe: MemfdProbe | None = None,
    ) -> None:
        """``probe``: this process's host identity and the memfd peers map to learn whether they share
        its memory (transport/peers.py); held from the start, so that a peer configured first finds it."""
        self.kind, self._build, self.token, self._reconfigure = kind, build, token, reconfigure
        self.probe = probe
        self.job: JobSpec | None = None
        self._logic: Any = None
        self._lock = threading.Lock()  # one Configure at a time; logic and job change together
        self.stopped = threading.Event()

    def configure(self, job: JobSpec) -> None:
        if job.role != self.kind:
            raise ValueError(f"this process is a {self.kind}, not a {job.role}")
        job = replace(job, credential=self.token)  # for the calls this role makes to the others
        with self._lock:
            old = self._logic
            kept = self._reconfigure(old, job) if old is not None and self._reconfigure else None
            # the old logic stops first: its calls in flight fail fast instead of competing with the new
            if old is not None and kept is not old:
                _close(old)
            self._logic = kept if kept is not None else self._build(job)
            self.job = job

    def logic(self, context: grpc.ServicerContext) -> Any:
        """The logic of the current configuration, for a call of its generation; aborts otherwise."""
        job, logic = self.job, self._logic
        if logic is None or job is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.kind} is not configured yet")
        try:
            check_generation(generation_of(context.invocation_metadata()), job.generation, "call")
        except StaleGenerationError as e:
            context.abort(grpc.StatusCode.ABORTED, str(e))
        return logic

    def close(self) -> None:
        _close(self._logic)
        if self.probe is not None:
            self.probe.close()


class ControlServicer(rpc.ControlServicer):
    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def Health(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.HealthReply:
        """Answers anyone (it is the probe of pods and containers); only a caller with the job's
        credential learns more than "serving"."""
        if not has_credential(context.invocation_metadata(), self.host.token):
            return pb.HealthReply()
        job, logic = self.host.job, self.host._logic
        return pb.HealthReply(
            role=self.host.kind,
            pid=os.getpid(),
            configured=job is not None,
            index=job.index if job else -1,
            generation=job.generation if job else 0,
            state_step=getattr(logic, "step", -1) if self.host.kind == "memoryx" else -1,
            **self._probe(),
        )

    def _probe(self) -> dict[str, Any]:
        probe = self.host.probe
        return {} if probe is None else {"host": probe.identity, "probe_pid": probe.pid, "probe_fd": probe.fd}

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


def _watch_stdin(stopped: threading.Event) -> None:
    sys.stdin.read()  # nothing more is written: this returns when the last writer, the coordinator, is gone
    if not stopped.is_set():
        log.error("standard input closed: the coordinator is gone; shutting down")
        stopped.set()


def _warm(warm: Callable[[], None]) -> None:
    """Run ``warm``; a failure there costs the first step the time it would have saved, nothing more."""
    t0 = time.monotonic()
    try:
        warm()
    except Exception:
        log.warning("warming the kernels failed; the first step loads them instead", exc_info=True)
        return
    log.info("kernels warm in %.2fs", time.monotonic() - t0)


def _exit_by(deadline_s: float) -> None:
    """End the process ``deadline_s`` from now if it is still running then (a daemon thread: it keeps
    running while the interpreter's exit waits for the other threads)."""

    def guard() -> None:
        time.sleep(deadline_s)
        busy = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        log.error("still running %.0fs after being told to stop (threads %s); exiting now", deadline_s, busy)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    threading.Thread(target=guard, name="exit-deadline", daemon=True).start()


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
    lifeline: bool = False,
    reconfigure: Reconfigure | None = None,
    exit_deadline_s: float = EXIT_DEADLINE_S,
    bulk_port: int | None = 0,
    warm: Callable[[], None] | None = None,
) -> None:
    """Run a role until it is told to stop. ``port=0`` picks a free port (reported in the ready file);
    ``token`` is the job's role credential, required on every call but Health; ``lifeline``: stop when
    standard input closes (the coordinator holds it open while it lives); ``exit_deadline_s``: how
    long the process may take to exit once told to stop before it ends itself; ``bulk_port``: the port
    of its bulk transfers on ``host`` (transport/bulk.py; 0 picks a free one; None: none, every byte of
    the network plane goes over gRPC); ``warm``: called once in the background as soon as the role listens
    (its kind's numba kernels: numerics/warm.py)."""
    role = RoleHost(kind, build, token, reconfigure, MemfdProbe(job_tag(token)))
    if bulk_port is not None:
        end = bulk.start(host, token, bulk_port)
        log.info("%s bulk transfers on %s:%d", kind, host, end.port)

    def register(server: grpc.Server) -> None:
        rpc.add_ControlServicer_to_server(ControlServicer(role), server)
        add_servicer(role, server)

    server, bound = create_server(f"{host}:{port}", register, interceptors=[RoleAuthInterceptor(token)])
    told: list[int] = []  # the signal that told the role to stop, if one did

    def on_signal(signum: int, _frame: Any) -> None:
        told.append(signum)
        role.stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid, role.stopped), daemon=True).start()
    if lifeline:
        threading.Thread(target=_watch_stdin, args=(role.stopped,), name="lifeline", daemon=True).start()
    if ready_file is not None:
        ready = {"address": f"{host}:{bound}", "host": socket.gethostname(), "pid": os.getpid()}
        write_text_durably(ready_file, json.dumps(ready))
    log.info("%s listening on %s:%d", kind, host, bound)
    if warm is not None:
        threading.Thread(target=_warm, args=(warm,), name="warm", daemon=True).start()
    role.stopped.wait()
    if told:
        log.info("stopping on %s", signal.Signals(told[0]).name)
    _exit_by(exit_deadline_s)
    server.stop(grace=1.0).wait(timeout=5)
    serving = bulk.endpoint()
    if serving is not None:
        log.info("%s", serving.summary())
    bulk.stop()
    role.close()
    time.sleep(0.05)
    if told:
        # the shell's (and Kubernetes') convention, 128 + the signal: whoever started the role can tell a
        # stop it was told from an end of its own (the parent gone, a Shutdown call: status 0)
        raise SystemExit(128 + told[0])

"""Where a job's roles run. One narrow interface; local processes now, Kubernetes pods later.

A backend starts every role of a job, reports each one's address once it listens, tells the coordinator
when a role has died (and how), and stops everything, leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["Backend", "BackendError", "LocalProcessBackend", "RoleSpec"]


class BackendError(RuntimeError):
    """A role could not be started, did not become ready, or died."""


@dataclass(frozen=True)
class RoleSpec:
    kind: str  # memoryx | swarmx | activation | worker
    index: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"


class Backend(Protocol):
    def start(self, roles: list[RoleSpec]) -> None: ...

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        """Addresses by kind, in index order, once every role listens."""
        ...

    def failures(self) -> list[str]:
        """One line per role that has exited unexpectedly (empty while all run)."""
        ...

    def stop(self) -> None:
        """Stop every role; idempotent; returns when none is left."""
        ...


# Roles allocate and free unit-sized buffers all the time, from several threads. glibc gives threads
# arenas of their own that each keep what was freed in them, so resident memory grows with every thread
# that ever held a unit: two arenas bound that (a test checks a worker's memory against depth). The mmap
# threshold is fixed at 64 MiB, where glibc would move it after large frees: smaller buffers (activations,
# messages) are reused from the heap without page faults, and larger ones go back to the system when
# freed. A 1 MiB threshold made every activation a fresh zeroed mapping and a GPT-2 step 40% slower.
STREAMING_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_ARENA_MAX": "2"}


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


class LocalProcessBackend:
    """Every role as a child process of this one, talking gRPC over loopback (127.0.0.1).

    Each role writes its port to a ready file in ``run_dir`` and its output to ``run_dir/<role>.log``.
    Roles watch this process's pid and exit if it disappears, so even SIGKILL on the coordinator leaves
    no orphans behind for long.
    """

    def __init__(self, run_dir: Path, host: str = "127.0.0.1") -> None:
        self.run_dir, self.host = run_dir, host
        self.procs: dict[RoleSpec, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def _ready_file(self, role: RoleSpec) -> Path:
        return self.run_dir / f"{role.name}.ready.json"

    def _env(self, role: RoleSpec, num_workers: int) -> dict[str, str]:
        """Threads per process: all roles share this machine's cores, so the workers (the compute) split
        them and every other role gets one. Without this each process's BLAS would start a spinning
        thread per core, and a handful of processes on a few cores would mostly fight each other."""
        threads = max(1, (os.cpu_count() or 1) // max(1, num_workers)) if role.kind == "worker" else 1
        names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "WEIGHTSTREAM_NUM_THREADS")
        return {**os.environ, **{n: str(threads) for n in names}, **STREAMING_MALLOC_ENV}

    def start(self, roles: list[RoleSpec]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        num_workers = sum(r.kind == "worker" for r in roles)
        for role in roles:
            self._ready_file(role).unlink(missing_ok=True)
            cmd = [
                sys.executable,
                "-m",
                "weightstream.cli",
                role.kind,
                "--host",
                self.host,
                "--port",
                "0",
                "--ready-file",
                str(self._ready_file(role)),
                "--parent-pid",
                str(os.getpid()),
            ]
            with open(self.run_dir / f"{role.name}.log", "ab") as log:
                # own session: a Ctrl-C in the terminal reaches the coordinator, which stops roles in order
                self.procs[role] = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self._env(role, num_workers),
                )

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout_s
        addresses: dict[RoleSpec, str] = {}
        while len(addresses) < len(self.procs):
            if self._stopping:
                raise BackendError("stopped while starting")
            dead = self.failures()
            if dead:
                raise BackendError("; ".join(dead))
            for role in self.procs:
                f = self._ready_file(role)
                if role not in addresses and f.exists():
                    addresses[role] = json.loads(f.read_text())["address"]
            if time.monotonic() > deadline:
                missing = sorted(r.name for r in self.procs if r not in addresses)
                raise BackendError(
                    f"not ready after {timeout_s:.0f}s: {', '.join(missing)} (see {self.run_dir})"
                )
            time.sleep(0.05)
        out: dict[str, list[str]] = {}
        for role in sorted(addresses, key=lambda r: (r.kind, r.index)):
            out.setdefault(role.kind, []).append(addresses[role])
        return out

    def failures(self) -> list[str]:
        if self._stopping:
            return []
        out = []
        for role, p in self.procs.items():
            rc = p.poll()
            if rc is not None:
                log = self.run_dir / f"{role.name}.log"
                out.append(f"{role.name} (pid {p.pid}) {describe_exit(rc)}; its log: {log}")
        return out

    def stop(self, grace_s: float = 3.0) -> None:
        self._stopping = True
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

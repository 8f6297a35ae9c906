"""The local backend: every role of a job as a child process of the coordinator, over loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from weightstream.backends.base import RoleSpec, ready_file, role_command, wait_ready_files
from weightstream.backends.environment import role_env, without_secrets

__all__ = ["LocalProcessBackend", "describe_exit"]


def describe_exit(rc: int) -> str:
    """A role's end from its exit status: < 0 killed by a signal; a role told to stop by SIGTERM or SIGINT
    stops in order and exits 128 + the signal (``role.serve_role``)."""
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    if rc - 128 in (signal.SIGTERM, signal.SIGINT):
        return f"stopped on {signal.Signals(rc - 128).name} (exit status {rc})"
    return f"exited with status {rc}"


class LocalProcessBackend:
    co_located = True  # processes on this host: the shared-memory data plane works between them
    """Every role as a child process of this one, talking gRPC over loopback (127.0.0.1).

    Each role writes its port to a ready file in ``run_dir`` and its output to ``run_dir/<role>.log``.
    Roles watch this process's pid and exit if it disappears, so even SIGKILL on the coordinator leaves
    no orphans behind for long.
    """

    def __init__(self, run_dir: Path, host: str = "127.0.0.1") -> None:
        self.run_dir, self.host = run_dir, host
        self.procs: dict[RoleSpec, subprocess.Popen[bytes]] = {}
        self._stopping = False
        self._credential, self._num_workers = "", 1
        # stop() may come from another thread (a cancel) while start() is still starting roles: the lock
        # makes a role either started before stop() looks, and so stopped, or never started
        self._lock = threading.Lock()

    def _ready_file(self, role: RoleSpec) -> Path:
        return ready_file(self.run_dir, role)

    def _env(self, role: RoleSpec, num_workers: int) -> dict[str, str]:
        """All roles share this machine's cores: the workers split them. A role inherits this process's
        environment less its secrets (the service's API token above all)."""
        worker_cores = (os.cpu_count() or 1) // max(1, num_workers)
        return {**without_secrets(os.environ), **role_env(role.kind, worker_cores)}

    def start(self, roles: list[RoleSpec], credential: str) -> None:
        """Start every role; each reads ``credential`` from a pipe on its standard input (``--token-file
        -``), so the token is on no command line, in no environment and in no file."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._credential = credential
        self._num_workers = sum(r.kind == "worker" for r in roles)
        for role in roles:
            if not self._spawn(role):
                return

    def restart(self, roles: list[RoleSpec]) -> None:
        """Kill each of ``roles`` that still runs (SIGKILL: it may be hung), and start it again (a retired
        one too). This host always has room: it never raises NoCapacityError."""
        for role in roles:
            with self._lock:
                old = self.procs.get(role)
            if old is not None and old.poll() is None:
                old.kill()
            if old is not None:
                old.wait(timeout=30)
            if not self._spawn(role):
                return

    def retire(self, roles: list[RoleSpec], grace_s: float = 3.0) -> None:
        """Forget each of ``roles`` (the job goes on without it): SIGTERM it if it still runs, SIGKILL after
        ``grace_s``. ``restart`` starts it again."""
        for role in roles:
            with self._lock:
                proc = self.procs.pop(role, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def _spawn(self, role: RoleSpec) -> bool:
        """Start ``role``'s process (False: the backend is stopping, nothing was started)."""
        self._ready_file(role).unlink(missing_ok=True)
        cmd = role_command(role, self.host, self._ready_file(role), "--parent-pid", str(os.getpid()))
        with self._lock, open(self.run_dir / f"{role.name}.log", "ab") as log:
            if self._stopping:
                return False
            # own session: a Ctrl-C in the terminal reaches the coordinator, which stops roles in order
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self._env(role, self._num_workers),
            )
            self.procs[role] = proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(self._credential.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:  # the role died at once: failures() reports it with its log
            pass
        return True

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        with self._lock:
            roles = list(self.procs)
        return wait_ready_files(self.run_dir, roles, timeout_s, lambda: self._stopping, self.failures)

    def dead(self) -> dict[RoleSpec, str]:
        if self._stopping:
            return {}
        out = {}
        with self._lock:
            procs = list(self.procs.items())
        for role, p in procs:
            rc = p.poll()
            if rc is not None:
                log = self.run_dir / f"{role.name}.log"
                out[role] = f"{role.name} (pid {p.pid}) {describe_exit(rc)}; its log: {log}"
        return out

    def failures(self) -> list[str]:
        return list(self.dead().values())

    def stop(self, grace_s: float = 3.0) -> None:
        with self._lock:
            self._stopping = True
            procs = list(self.procs.values())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

"""The local backend: every role of a job as a child process of the coordinator, over loopback.

Standby processes: a role process's kind is fixed when it starts, but its index and everything else come
with the coordinator's Configure call, so a process of a kind, started ahead with the job's credential, can
serve any role of that kind. Once the job's roles are ready (``keep_standby``), a keeper thread keeps that
many such spares of each kind running; ``restart`` hands a lost role to a ready spare instead of starting a
Python process (numpy, gRPC: most of a recovery's time), and the keeper starts another spare in the
background.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from weightstream.backends.base import RoleSpec, ready_file, role_command, wait_ready_files
from weightstream.backends.environment import role_env, without_secrets
from weightstream.plan import process_kind

__all__ = ["LocalProcessBackend", "Spare", "describe_exit"]

log = logging.getLogger("weightstream.backends.local")

# How often the keeper looks for a spare that has ended, besides when ``restart`` takes one: a dead spare
# costs nothing until a fault would need it, so the look can be rare, and each look is a few poll()s.
KEEPER_POLL_S = 0.5
# Spares of one kind that end in a row without ever becoming ready: then that kind gets no more (a spare
# that cannot start, a broken environment, would otherwise be started again twice a second for good).
MAX_SPARE_FAILURES = 3
# How long after ``restart`` the keeper waits before it starts spares in place of those taken: a process
# start is about a second of CPU (imports), which would otherwise compete with the recovery it follows
# (every role configured again, MemoryX rebuilt and steps replayed after a shard's loss) on the same cores.
RESTOCK_DELAY_S = 2.0


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


@dataclass
class Spare:
    """A started, unconfigured process of ``kind`` that serves no role yet: ``ready`` (under its own name)
    appears once it listens, and ``log`` takes its output."""

    kind: str
    serial: int  # distinct for every spare of a backend: names a spare's files
    proc: subprocess.Popen[bytes]
    ready: Path
    log: Path
    seen_ready: bool = field(default=False)

    @property
    def name(self) -> str:
        return f"standby-{self.kind}-{self.serial}"

    def is_ready(self) -> bool:
        """Whether it runs and has written its ready file (which ``restart`` then moves to a role's)."""
        return self.proc.poll() is None and self.ready.exists()


class LocalProcessBackend:
    co_located = True  # processes on this host: the shared-memory data plane works between them
    """Every role as a child process of this one, talking gRPC over loopback (127.0.0.1).

    Each role writes its port to a ready file in ``run_dir`` and its output to ``run_dir/<role>.log`` (a
    role handed to a spare: the spare's ``run_dir/standby-<kind>-<n>.log``, as the role's log says).
    Roles and spares watch this process's pid and exit if it disappears, so even SIGKILL on the
    coordinator leaves no orphans behind for long.
    """

    def __init__(self, run_dir: Path, host: str = "127.0.0.1") -> None:
        self.run_dir, self.host = run_dir, host
        self.procs: dict[RoleSpec, subprocess.Popen[bytes]] = {}  # the process serving each role
        self.logs: dict[RoleSpec, Path] = {}  # where the process serving each role writes its output
        self.spares: list[Spare] = []
        self._stopping = False
        self._credential, self._num_workers = "", 1
        self._kinds: list[str] = []  # the job's role kinds, in the order of its roles
        self._standby = 0  # spares kept per kind (keep_standby)
        self._serials = itertools.count()
        self._spare_failures: dict[str, int] = defaultdict(int)  # in a row, by kind
        self._keeper: threading.Thread | None = None
        self._wake = threading.Event()  # a spare was taken, or the backend stops: the keeper looks now
        self._restock_at = 0.0  # monotonic time before which the keeper starts no spare
        # stop() may come from another thread (a cancel) while start() is still starting roles, or the
        # keeper a spare: the lock makes a process either started and registered before stop() looks,
        # and so stopped, or never started
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
        # by the process a role runs (a MemoryX replica is a MemoryX process: one spare serves either)
        self._kinds = list(dict.fromkeys(process_kind(r.kind) for r in roles))
        for role in roles:
            if not self._spawn(role):
                return

    def keep_standby(self, per_kind: int) -> None:
        """Keep ``per_kind`` spares of each of the job's role kinds from now on (0: none), started in the
        background by the keeper thread. The runner calls this once the job's roles are ready, so that
        spares do not slow the job's first start."""
        with self._lock:
            self._standby = per_kind
            if self._stopping or per_kind == 0 or self._keeper is not None:
                return
            self._keeper = threading.Thread(target=self._keep, name="standby-keeper", daemon=True)
            self._keeper.start()

    def restart(self, roles: list[RoleSpec]) -> None:
        """Kill each of ``roles`` that still runs (SIGKILL: it may be hung) and hand it to a ready spare
        of its kind, or start it again where there is none (a retired one too); the keeper starts spares
        in place of those taken, in the background. This host always has room: it never raises
        NoCapacityError."""
        for role in roles:
            with self._lock:
                old = self.procs.get(role)
            if old is not None and old.poll() is None:
                old.kill()
            if old is not None:
                old.wait(timeout=30)
            if not self._adopt(role) and not self._spawn(role):
                return
        self._restock_at = time.monotonic() + RESTOCK_DELAY_S
        self._wake.set()

    def _adopt(self, role: RoleSpec) -> bool:
        """Hand ``role`` to a ready spare of its kind (False: there is none, or the backend is stopping).

        The spare's own ready file becomes the role's (os.replace: a reader sees the old file or the whole
        new one), so the role's ready file is always written by the process that serves it."""
        with self._lock:
            if self._stopping:
                return False
            kind = process_kind(role.kind)
            spare = next((s for s in self.spares if s.kind == kind and s.is_ready()), None)
            if spare is None:
                return False
            self.spares.remove(spare)
            self.procs[role], self.logs[role] = spare.proc, spare.log
        os.replace(spare.ready, self._ready_file(role))
        self._note(
            self.run_dir / f"{role.name}.log",
            f"{role.name} is now served by {spare.name} (pid {spare.proc.pid}); its log: {spare.log}",
        )
        return True

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
        ready, out = self._ready_file(role), self.run_dir / f"{role.name}.log"
        ready.unlink(missing_ok=True)
        with self._lock, open(out, "ab") as f:
            if self._stopping:
                return False
            proc = self.procs[role] = self._popen(role, ready, f)
            self.logs[role] = out
        self._hand_credential(proc)
        return True

    def _spawn_spare(self, kind: str) -> bool:
        """Start a spare of ``kind`` (False: the backend is stopping, nothing was started)."""
        serial = next(self._serials)
        name = f"standby-{kind}-{serial}"
        # a ready file left by an earlier run in this directory would pass for this spare's
        ready, out = self.run_dir / f"{name}.ready.json", self.run_dir / f"{name}.log"
        ready.unlink(missing_ok=True)
        with self._lock, open(out, "ab") as f:
            if self._stopping:
                return False
            # started as a role of its kind: the command and the environment depend on the kind only
            proc = self._popen(RoleSpec(kind, serial), ready, f)
            self.spares.append(Spare(kind, serial, proc, ready, out))
        self._hand_credential(proc)
        return True

    def _popen(self, role: RoleSpec, ready: Path, out: IO[bytes]) -> subprocess.Popen[bytes]:
        """A process of ``role``'s kind writing ``ready`` and its output to ``out``; called under the lock."""
        cmd = role_command(role, self.host, ready, "--parent-pid", str(os.getpid()))
        # own session: a Ctrl-C in the terminal reaches the coordinator, which stops roles in order
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self._env(role, self._num_workers),
        )

    def _hand_credential(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(self._credential.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:  # it died at once: failures() reports a role with its log
            pass

    @staticmethod
    def _note(path: Path, line: str) -> None:
        """Append ``line`` to the log ``path`` (a process may be writing to it too: appends interleave
        whole)."""
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} backend {line}\n")

    # -- the keeper ------------------------------------------------------------------------------------
    def _keep(self) -> None:
        """Until the backend stops: replace spares that ended, and start those missing (not within
        ``RESTOCK_DELAY_S`` of a restart)."""
        while True:
            self._wake.clear()
            if self._stopping:
                return
            hold_s = self._restock_at - time.monotonic()
            if hold_s > 0:
                self._wake.wait(hold_s)
                continue
            for kind in self._missing():
                if not self._spawn_spare(kind):
                    return
            self._wake.wait(KEEPER_POLL_S)

    def _missing(self) -> list[str]:
        """Forget the spares that have ended (noting why in their logs); the kinds to start one of, one
        entry per spare missing."""
        with self._lock:
            ended = [s for s in self.spares if s.proc.poll() is not None]
            self.spares = [s for s in self.spares if s not in ended]
            for s in self.spares:
                s.seen_ready = s.seen_ready or s.ready.exists()
                if s.seen_ready:
                    self._spare_failures[s.kind] = 0
            standby, kinds = self._standby, self._kinds
        for s in ended:
            rc = s.proc.returncode
            self._note(s.log, f"{s.name} (pid {s.proc.pid}) {describe_exit(rc)} while serving no role")
            if not s.seen_ready:
                self._spare_failures[s.kind] += 1
                if self._spare_failures[s.kind] == MAX_SPARE_FAILURES:
                    log.warning(
                        "%d standby %s processes in a row ended before they were ready (the last: %s); "
                        "keeping none of that kind, a lost %s is started afresh",
                        MAX_SPARE_FAILURES,
                        s.kind,
                        s.log,
                        s.kind,
                    )
        return [
            kind
            for kind in kinds
            if self._spare_failures[kind] < MAX_SPARE_FAILURES
            for _ in range(standby - sum(s.kind == kind for s in self.spares))
        ]

    # -- the coordinator's view ------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        with self._lock:
            roles = list(self.procs)
        return wait_ready_files(self.run_dir, roles, timeout_s, lambda: self._stopping, self.failures)

    def dead(self) -> dict[RoleSpec, str]:
        """Roles whose serving process has ended; a spare that ends is no fault of the job (the keeper
        starts another)."""
        if self._stopping:
            return {}
        out = {}
        with self._lock:
            procs = [(role, p, self.logs[role]) for role, p in self.procs.items()]
        for role, p, out_log in procs:
            rc = p.poll()
            if rc is not None:
                out[role] = f"{role.name} (pid {p.pid}) {describe_exit(rc)}; its log: {out_log}"
        return out

    def failures(self) -> list[str]:
        return list(self.dead().values())

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop every role and every spare (one still starting included): SIGTERM, then SIGKILL what is
        left after ``grace_s``; the keeper starts nothing after this."""
        with self._lock:
            self._stopping = True
            procs = [*self.procs.values(), *(s.proc for s in self.spares)]
            keeper = self._keeper
        self._wake.set()
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
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=5)

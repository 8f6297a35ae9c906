"""The interface between the coordinator and wherever roles run.

A backend starts every role of a job, reports each one's address once it listens, tells the coordinator
when a role has died (and how), replaces single roles while the others run on (the coordinator's fault
recovery), says when it has no room for a replacement now (``NoCapacityError``: the job may go on with fewer
workers, and ``retire`` them until there is), and stops everything, leaving nothing behind.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from weightstream.plan import process_kind

__all__ = [
    "Backend",
    "BackendError",
    "NoCapacityError",
    "RoleSpec",
    "by_kind",
    "read_ready",
    "ready_file",
    "role_command",
    "wait_ready_files",
]


class BackendError(RuntimeError):
    """A role could not be started, did not become ready, or died."""


class NoCapacityError(BackendError):
    """Some roles cannot be placed now (no node, slot or resource free for them); it may pass. ``roles``:
    those not started, in the order asked for; every other role of the same call was started."""

    def __init__(self, roles: list[RoleSpec], why: str) -> None:
        self.roles = list(roles)
        super().__init__(f"no capacity for {', '.join(r.name for r in self.roles)} now: {why}")


@dataclass(frozen=True)
class RoleSpec:
    kind: str  # memoryx | memoryx-replica | swarmx | activation | worker (plan.ROLE_KINDS)
    index: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"


class Backend(Protocol):
    # every role runs on this host, in this PID namespace, as this user, so every pair of roles can share
    # memory (transport/peers.py still checks each pair); False: ``data_plane: shared_memory`` is refused
    co_located: bool

    def start(self, roles: list[RoleSpec], credential: str) -> None:
        """Start every role. ``credential`` is the job's role token: each role must receive it from a
        file or a Kubernetes Secret (never a command line or an inherited environment)."""
        ...

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        """Addresses by kind, in index order, once every role listens: every role of the job but those
        retired (``retire``), which have none."""
        ...

    def failures(self) -> list[str]:
        """One line per role that has exited unexpectedly (empty while all run)."""
        ...

    def dead(self) -> dict[RoleSpec, str]:
        """Every role that has exited, been deleted or evicted, or cannot run, with how (the same words
        as ``failures``); empty while all run and after ``stop``."""
        ...

    def keep_standby(self, per_kind: int) -> None:
        """Keep ``per_kind`` started, unconfigured processes of each of the job's role kinds from now on
        (``runconfig.standby_roles``; called once the job's roles are ready), so that ``restart`` can hand
        a lost role to one instead of starting a process. A backend that keeps none ignores it."""
        ...

    def restart(self, roles: list[RoleSpec]) -> None:
        """Replace each of ``roles``: kill it if it is still there (a hung role: SIGKILL, or its pod deleted
        at once), wait until it is gone, and start it again with the job's credential (or hand it to a
        standby process of its kind, ``keep_standby``). Returns once they are started; ``wait_ready`` then
        gives every role's address (a replacement's may be new). A retired role (``retire``) is started
        again the same way and is the job's again from then on. Raises NoCapacityError, having started the
        others, when some cannot be placed now."""
        ...

    def retire(self, roles: list[RoleSpec]) -> None:
        """Forget ``roles``, which the job goes on without (a worker whose replacement found no capacity):
        stop each one still running, and never report it dead again (``failures``, ``dead``) nor wait
        for it (``wait_ready``) until ``restart`` starts it again."""
        ...

    def stop(self) -> None:
        """Stop every role; idempotent; returns when none is left."""
        ...


def ready_file(run_dir: Path, role: RoleSpec) -> Path:
    """Where the process serving ``role`` writes ``{"address", "host", "pid"}`` once it listens (and a
    replacement writes it again)."""
    return run_dir / f"{role.name}.ready.json"


def role_command(role: RoleSpec, host: str, ready: Path, *lifeline: str) -> list[str]:
    """The command that serves ``role``: it listens on ``host`` at a free port, reports it in ``ready``, and
    reads the job's credential from its standard input (never a command line); ``lifeline`` says how it
    learns its starter is gone (``--parent-pid PID``, or ``--until-stdin-closes`` where its parent is not
    the coordinator)."""
    return [
        sys.executable, "-m", "weightstream.cli", process_kind(role.kind), "--host", host, "--port", "0",
        "--ready-file", str(ready), "--token-file", "-", *lifeline,
    ]  # fmt: skip


def read_ready(run_dir: Path, roles: list[RoleSpec], addresses: dict[RoleSpec, str]) -> None:
    """Add to ``addresses`` the address of each of ``roles`` whose ready file has appeared."""
    for role in roles:
        f = ready_file(run_dir, role)
        if role not in addresses and f.exists():
            addresses[role] = json.loads(f.read_text())["address"]


def by_kind(addresses: dict[RoleSpec, str]) -> dict[str, list[str]]:
    """Addresses by kind, each kind's in index order: what ``Backend.wait_ready`` returns."""
    out: dict[str, list[str]] = {}
    for role in sorted(addresses, key=lambda r: (r.kind, r.index)):
        out.setdefault(role.kind, []).append(addresses[role])
    return out


def wait_ready_files(
    run_dir: Path,
    roles: list[RoleSpec],
    timeout_s: float,
    stopping: Callable[[], bool],
    failures: Callable[[], list[str]],
    where: Callable[[], str] = str,
    named: Callable[[RoleSpec], str] = lambda role: role.name,
) -> dict[str, list[str]]:
    """Addresses by kind once every one of ``roles`` has written its ready file under ``run_dir``.

    Raises BackendError when ``stopping()`` (checked first: a job cancelled while starting may have no
    process yet, and an empty answer would read as "ready"), when ``failures()`` names a dead role, or
    after ``timeout_s``, naming each missing role by ``named(role)``; ``where()`` ends every message (the
    backend's own context, such as its Slurm job)."""
    deadline = time.monotonic() + timeout_s
    addresses: dict[RoleSpec, str] = {}
    while True:
        if stopping():
            raise BackendError(f"stopped while starting{where()}")
        dead = failures()
        if dead:
            raise BackendError("; ".join(dead) + where())
        read_ready(run_dir, roles, addresses)
        if len(addresses) == len(roles):  # at once: a replacement handed a spare is ready before any look
            return by_kind(addresses)
        if time.monotonic() > deadline:
            missing = sorted(named(r) for r in roles if r not in addresses)
            raise BackendError(
                f"not ready after {timeout_s:.0f}s: {', '.join(missing)}{where()} (see {run_dir})"
            )
        time.sleep(0.05)

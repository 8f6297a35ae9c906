"""The interface between the coordinator and wherever roles run.

A backend starts every role of a job, reports each one's address once it listens, tells the coordinator
when a role has died (and how), and stops everything, leaving nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Backend", "BackendError", "RoleSpec"]


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
    def start(self, roles: list[RoleSpec], credential: str) -> None:
        """Start every role. ``credential`` is the job's role token: each role must receive it from a
        file or a Kubernetes Secret (never a command line or an inherited environment)."""
        ...

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        """Addresses by kind, in index order, once every role listens."""
        ...

    def failures(self) -> list[str]:
        """One line per role that has exited unexpectedly (empty while all run)."""
        ...

    def stop(self) -> None:
        """Stop every role; idempotent; returns when none is left."""
        ...

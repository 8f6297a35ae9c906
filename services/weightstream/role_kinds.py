"""The role kinds a process can serve, listed once: what each role package gives ``role.serve_role``.

A role process (``weightstream memoryx|swarmx|worker|activation``) finds its kind here. Each kind's
package implements ``RoleKind`` in its ``service`` module: ``build`` makes the role's logic for a job,
``add_servicer`` registers its gRPC service through the generated code, and ``reconfigure``, where a role
has it, keeps the role's state across a new configuration (MemoryX keeps its weights; the others are built
anew). Every import of a role's service module is written out below, so the import linter sees each one
(pyproject.toml: only this module imports them), and a role process imports only its own kind's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

    from weightstream.plan import JobSpec
    from weightstream.role import Reconfigure, RoleHost

__all__ = ["KINDS", "RoleKind", "role_kind"]


@dataclass(frozen=True)
class RoleKind:
    """What serving one kind of role takes."""

    build: Callable[[JobSpec], Any]  # the role's logic for a job
    add_servicer: Callable[[RoleHost, grpc.Server], None]  # its service, by the generated add_*_to_server
    reconfigure: Reconfigure | None = None  # keep its state across a new configuration; None: build anew


@dataclass(frozen=True)
class Listed:
    """A kind as the command line lists it: its description, and how to load its package."""

    what: str
    load: Callable[[], RoleKind]


def _memoryx() -> RoleKind:
    from weightstream.memoryx import service

    return RoleKind(service.build, service.add_servicer, service.reconfigure)


def _swarmx() -> RoleKind:
    from weightstream.swarmx import service

    return RoleKind(service.build, service.add_servicer)


def _worker() -> RoleKind:
    from weightstream.worker import service

    return RoleKind(service.build, service.add_servicer)


def _activation() -> RoleKind:
    from weightstream.activation import service

    return RoleKind(service.build, service.add_servicer, service.reconfigure)


KINDS: dict[str, Listed] = {
    "memoryx": Listed("MemoryX weight server shard", _memoryx),
    "swarmx": Listed("SwarmX broadcast/reduce node", _swarmx),
    "worker": Listed("CS-2 worker", _worker),
    "activation": Listed("activation server", _activation),
}


def role_kind(name: str) -> RoleKind:
    """The kind ``name``'s package, loaded; ValueError naming the kinds there are for any other name."""
    listed = KINDS.get(name)
    if listed is None:
        raise ValueError(f"no role kind {name!r}: the kinds are {', '.join(KINDS)}")
    return listed.load()

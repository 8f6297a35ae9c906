"""The role kinds a process can serve, listed once: what each role package gives ``role.serve_role``.

A role process (``weightstream memoryx|swarmx|worker|activation``) finds its kind here. Each kind's
package implements the declared protocol in its ``service`` module, ``RoleService`` or, for a role that
keeps its state across a new configuration, ``StatefulRoleService``: ``build`` makes the role's logic for
a job, ``add_servicer`` registers its gRPC service through the generated code
(``transport.servicers.register_servicer``), and ``reconfigure`` keeps the logic ``build`` made across a new
configuration, or says to build anew (MemoryX keeps its weights). The loaders below pass the module itself
as the protocol, so a type checker checks each against it, and tests/unit/test_role_kinds.py checks the
names and annotations at run time. Every import of a role's service module is written out below, so the
import linter sees each one (pyproject.toml: only this module imports them), and a role process imports
only its own kind's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import grpc

    from weightstream.plan import JobSpec
    from weightstream.role import Reconfigure, RoleHost

__all__ = ["KINDS", "RoleKind", "RoleService", "StatefulRoleService", "role_kind"]

L = TypeVar("L")  # a role's logic: what ``build`` makes and ``reconfigure`` keeps


class RoleService(Protocol):
    """What a role package's ``service`` module provides."""

    def build(self, job: JobSpec) -> Any:
        """The role's logic for ``job`` (its servicer reaches it through ``RoleHost.logic``)."""
        ...

    def add_servicer(self, host: RoleHost, server: grpc.Server) -> None:
        """Register the role's gRPC service on ``server``, its logic reached through ``host``."""
        ...


class StatefulRoleService(RoleService, Protocol[L]):
    """A ``RoleService`` whose logic may outlive a configuration."""

    def build(self, job: JobSpec) -> L: ...

    # positional: ``RoleHost`` passes both so, and each role names its own logic
    def reconfigure(self, logic: L, job: JobSpec, /) -> L | None:
        """``logic``, adapted to ``job`` (a new configuration of the same job), to keep; None: build anew."""
        ...


@dataclass(frozen=True)
class RoleKind:
    """What serving one kind of role takes."""

    build: Callable[[JobSpec], Any]  # the role's logic for a job
    add_servicer: Callable[[RoleHost, grpc.Server], None]  # its service, by the generated add_*_to_server
    reconfigure: Reconfigure | None = None  # keep its state across a new configuration; None: build anew
    # its numba kernels, called once as the process starts (numerics/warm.py); None: it has none
    warm: Callable[[], None] | None = None


@dataclass(frozen=True)
class Listed:
    """A kind as the command line lists it: its description, and how to load its package."""

    what: str
    load: Callable[[], RoleKind]


def _serving(service: RoleService) -> RoleKind:
    return RoleKind(service.build, service.add_servicer)


def _keeping_state(service: StatefulRoleService[L]) -> RoleKind:
    return RoleKind(service.build, service.add_servicer, service.reconfigure)


def _memoryx() -> RoleKind:
    from weightstream.memoryx import service
    from weightstream.numerics.warm import warm_update_kernels

    return replace(_keeping_state(service), warm=warm_update_kernels)


def _swarmx() -> RoleKind:
    from weightstream.swarmx import service

    return _serving(service)


def _worker() -> RoleKind:
    from weightstream.numerics.warm import warm_layer_kernels
    from weightstream.worker import service

    return replace(_serving(service), warm=warm_layer_kernels)


def _activation() -> RoleKind:
    from weightstream.activation import service

    return _keeping_state(service)


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

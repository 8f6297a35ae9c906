"""Whether a lost role can be started again now, as the Slurm backend decides it: a worker without a node
that serves is left out (``NoCapacityError``), and the job may go on with fewer workers
(``runconfig.min_num_csx``) until one serves again."""

from __future__ import annotations

from weightstream.backends.base import NoCapacityError, RoleSpec
from weightstream.backends.slurm.placement import Node

__all__ = ["no_room_for_worker", "refuse_unplaced"]


def no_room_for_worker(role: RoleSpec, node: Node, serving: set[str]) -> bool:
    """Whether ``role``, a lost worker, has no node to start again on now: ``node``, the one chosen for it
    (its own, or the allocation's least busy node that serves), does not serve (down, drained, gone from
    the job). Other roles are started there regardless, and fail as they did before."""
    return role.kind == "worker" and node.name not in serving


def refuse_unplaced(unplaced: list[RoleSpec], job_id: str) -> None:
    """Raise NoCapacityError naming the ``unplaced`` workers of Slurm job ``job_id``, if any, once
    ``restart`` has started the other roles."""
    if unplaced:
        raise NoCapacityError(unplaced, f"no node of Slurm job {job_id} that serves is free for it")

"""Where lost roles are started again, as the Slurm backend decides it (``nodes_for``), and which have no
room now: a worker without a node of its own is left out (``NoCapacityError``), and the job may go on with
fewer workers (``runconfig.min_num_csx``) until a node serves again.

A worker is a CS-2 system: it takes a node whole (its threads are its node's CPUs), so a lost worker has
room only on a node that no other worker of the job holds. The other roles share nodes and are started
wherever ``placement.replacement`` puts them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from weightstream.backends.base import NoCapacityError, RoleSpec
from weightstream.backends.slurm.placement import Node, PlacementError, PlacementRules, replacement

__all__ = ["nodes_for", "refuse_unplaced", "without_room"]


def nodes_for(
    roles: Sequence[RoleSpec],
    placed: Mapping[str, Node],
    serving: Sequence[Node],
    avoid: tuple[Collection[str], Collection[str]],
    rules: PlacementRules,
    running: Mapping[str, Node],
) -> tuple[dict[str, Node], list[RoleSpec]]:
    """(a node for each of the lost ``roles``, by name; the workers among them with no room now). ``placed``:
    every role's node by name; ``serving``: the allocation's nodes that serve; ``avoid``: the nodes found out
    of reach in this run, and those found so now (when every node left was out of reach once, those that
    answered now are used again); ``running``: the node of each other role that has a process. Raises
    NoCapacityError where no node is left and only workers were lost, PlacementError where others were."""
    names = [r.name for r in roles]
    try:
        try:
            chosen = replacement(names, placed, serving, avoid[0], rules)
        except PlacementError:
            chosen = replacement(names, placed, serving, avoid[1], rules)
    except PlacementError as e:
        if all(r.kind == "worker" for r in roles):
            raise NoCapacityError(list(roles), str(e)) from e
        raise
    return chosen, without_room(roles, chosen, running)


def without_room(
    roles: Sequence[RoleSpec], chosen: Mapping[str, Node], running: Mapping[str, Node]
) -> list[RoleSpec]:
    """The workers among ``roles`` (lost, to be started again), in that order, whose node in ``chosen``
    (by role name) another worker holds: one in ``running`` (the node of each role with a process, by
    name) that is not among ``roles``, or one of ``roles`` chosen for that node before it."""
    lost = {r.name for r in roles}
    held = {n.name for name, n in running.items() if name.startswith("worker-") and name not in lost}
    out = []
    for role in (r for r in roles if r.kind == "worker"):
        node = chosen[role.name].name
        if node in held:
            out.append(role)
        held.add(node)
    return out


def refuse_unplaced(unplaced: Sequence[RoleSpec], job_id: str) -> None:
    """Raise NoCapacityError naming the ``unplaced`` workers of Slurm job ``job_id``, if any, once
    ``restart`` has started the other roles."""
    if unplaced:
        raise NoCapacityError(
            list(unplaced), f"no node of Slurm job {job_id} that serves is free of other workers"
        )

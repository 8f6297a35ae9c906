"""Which Slurm node runs which role: a pure function of the job's role counts, the nodes that may serve,
and the rules saying which nodes serve which kind of role.

The appliance's shape, kept on a cluster of ordinary nodes:
- each CS-2 worker on a node of its own (a CS-2 is a machine of its own);
- each activation server beside the worker it feeds (activation ``a`` serves workers ``w`` with
  ``w % num_act == a``, so it goes where worker ``a % num_csx`` is): its batches never cross the network;
- MemoryX shards and SwarmX nodes on server nodes other than the workers' when there are such nodes
  (spread one role per node as far as they go), and beside the workers only when there are none;
- a shard's replica on another node than its shard, away from the workers and on the least busy node
  as far as the nodes allow: it is there to outlive the shard's host.

``replacement`` places roles again after a fault (``SlurmBackend.restart``): each stays on its node while
that node serves, and a role whose node is lost or out of reach moves to a node that keeps the shape above
as far as the nodes left allow.

Nodes are taken in Slurm's order (names compared with their numbers as numbers: h2 before h10).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from weightstream.plan import REPLICA

__all__ = ["Node", "NodeRule", "Placement", "PlacementError", "PlacementRules", "place", "replacement"]

SERVER_KINDS = ("memoryx", "swarmx")
WORKER_KINDS = ("worker", "activation")


class PlacementError(ValueError):
    """The cluster cannot hold the job: the message names the rule, what it needs and what there is."""


@dataclass(frozen=True)
class Node:
    """A Slurm node as ``sinfo`` reports it. ``address``: its NodeAddr, where its roles listen."""

    name: str
    address: str
    partitions: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    cpus: int = 1


@dataclass(frozen=True)
class NodeRule:
    """Which nodes may serve a group of roles: those of ``partition`` (None: any given) that have every
    one of ``features`` (Slurm's AVAIL_FEATURES)."""

    partition: str | None = None
    features: tuple[str, ...] = ()

    def admits(self, node: Node) -> bool:
        in_partition = self.partition is None or self.partition in node.partitions
        return in_partition and set(self.features) <= node.features

    def describe(self) -> str:
        parts = [f"partition {self.partition}" if self.partition else "any partition"]
        if self.features:
            parts.append(f"feature {'&'.join(self.features)}")
        return " with ".join(parts)


@dataclass(frozen=True)
class PlacementRules:
    """Where each group of roles may run: ``workers`` (CS-2 workers and their activation servers) and
    ``servers`` (MemoryX shards and SwarmX nodes). The default: any node given."""

    workers: NodeRule = field(default_factory=NodeRule)
    servers: NodeRule = field(default_factory=NodeRule)

    def in_partition(self, default: str | None, job_partition: str | None, job: str | None) -> PlacementRules:
        """These rules with their partition filled in: ``job_partition`` (that of allocation ``job``, which
        the roles run in), else the cluster's ``default``. Raises PlacementError where a rule asks for
        another partition than the allocation's."""
        base = job_partition or default

        def fill(rule: NodeRule) -> NodeRule:
            if job_partition and rule.partition and rule.partition != job_partition:
                raise PlacementError(
                    f"placement asks for partition {rule.partition}, but the allocation {job} is in "
                    f"partition {job_partition}"
                )
            return NodeRule(rule.partition or base, rule.features)

        return PlacementRules(fill(self.workers), fill(self.servers))


@dataclass(frozen=True)
class Placement:
    """Each role's node, by role name (``worker-0``...)."""

    nodes: Mapping[str, Node]

    def node_names(self) -> list[str]:
        """Every node the job uses, each once, in Slurm's order."""
        return [n.name for n in _in_order({n.name: n for n in self.nodes.values()}.values())]

    def roles_on(self, node: str) -> list[str]:
        return [role for role, n in self.nodes.items() if n.name == node]


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _in_order(nodes: Iterable[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: _natural(n.name))


def place(counts: Mapping[str, int], nodes: Sequence[Node], rules: PlacementRules | None = None) -> Placement:
    """Each role of a job with ``counts`` roles of each kind (memoryx, swarmx, activation, worker) on one
    of ``nodes`` (those that may serve: idle ones, or an allocation's), following ``rules``. Raises
    PlacementError naming what is missing when the nodes cannot hold the job."""
    rules = rules or PlacementRules()
    ordered = _in_order(nodes)
    num_workers = counts.get("worker", 0)
    worker_nodes = [n for n in ordered if rules.workers.admits(n)][:num_workers]
    if len(worker_nodes) < num_workers:
        have = ", ".join(n.name for n in worker_nodes) or "none"
        raise PlacementError(
            f"{num_workers} CS-2 workers need {num_workers} nodes of their own ({rules.workers.describe()}); "
            f"{len(worker_nodes)} of the {len(ordered)} nodes given can serve them: {have}"
        )
    out: dict[str, Node] = {f"worker-{i}": node for i, node in enumerate(worker_nodes)}
    for a in range(counts.get("activation", 0)):
        if num_workers == 0:
            raise PlacementError("activation servers go beside CS-2 workers, and the job has none")
        out[f"activation-{a}"] = worker_nodes[a % num_workers]
    servers = [f"{kind}-{i}" for kind in SERVER_KINDS for i in range(counts.get(kind, 0))]
    if servers:
        eligible = [n for n in ordered if rules.servers.admits(n)]
        taken = {n.name for n in worker_nodes}
        apart = [n for n in eligible if n.name not in taken]
        # on nodes of their own while there are any; beside the workers only on a cluster without spare nodes
        pool = apart or eligible
        if not pool:
            raise PlacementError(
                f"{len(servers)} MemoryX and SwarmX roles need a node ({rules.servers.describe()}); "
                f"none of the {len(ordered)} nodes given can serve them"
            )
        for i, role in enumerate(servers):
            out[role] = pool[i % len(pool)]
    workers_on = {n.name for n in worker_nodes}
    for i in range(counts.get(REPLICA, 0)):
        # a shard's replica is there to outlive the shard's host: on another node, away from the workers
        # (servers apart, as above) and on the least busy node, as far as the nodes allow
        shard = out[f"memoryx-{i}"]
        others = [n for n in ordered if n.name != shard.name]
        eligible = [n for n in others if rules.servers.admits(n)] or others
        out[f"{REPLICA}-{i}"] = (
            min(eligible, key=lambda n: (n.name in workers_on, _load(out, n))) if eligible else shard
        )
    return Placement(out)


def _load(placed: Mapping[str, Node], node: Node) -> int:
    """How many roles ``placed`` puts on ``node``."""
    return sum(1 for n in placed.values() if n.name == node.name)


def _kind_index(role: str) -> tuple[str, int]:
    kind, index = role.rsplit("-", 1)
    return kind, int(index)


# the order roles are placed again: a worker before the activation server beside it, a shard before its
# replica
_REPLACE_ORDER = ("worker", "activation", "memoryx", "swarmx", REPLICA)


def replacement(
    lost: Collection[str],
    placed: Mapping[str, Node],
    nodes: Sequence[Node],
    avoid: Collection[str] = (),
    rules: PlacementRules | None = None,
) -> dict[str, Node]:
    """A node for each role named in ``lost`` ("worker-1"...), every other role of the job staying where
    ``placed`` (each role's node, the lost ones' included) puts it. ``nodes``: those that serve now (up,
    in the job); ``avoid``: node names not to use even so (a node that did not answer when its roles were
    ended: dead, or cut off, which Slurm may not have seen yet).

    A lost role goes back to its own node while that node serves and is not avoided (its process died, its
    node did not). Otherwise, as far as the nodes left allow: a worker to a node with no other worker, an
    activation server beside the worker it feeds, a MemoryX shard or SwarmX node to a node without a
    worker, a shard and its replica on different nodes, and the least busy node first (Slurm's order
    among equals). Raises PlacementError when no node is left."""
    rules = rules or PlacementRules()
    shunned = set(avoid)
    usable = [n for n in _in_order(nodes) if n.name not in shunned]
    if not usable:
        given = ", ".join(n.name for n in nodes) or "none"
        raise PlacementError(
            f"no node left for {', '.join(sorted(lost))}: the nodes that serve ({given}) are all avoided "
            f"({', '.join(sorted(shunned))})"
        )
    names = {n.name for n in usable}
    out = {role: node for role, node in placed.items() if role not in lost}
    num_workers = sum(1 for role in placed if _kind_index(role)[0] == "worker")

    def has(kind: str, node: Node) -> bool:
        return any(_kind_index(r)[0] == kind and n.name == node.name for r, n in out.items())

    def partner(kind: str, index: int) -> str | None:
        """The node of the other process of a MemoryX shard (its replica, or the shard of a replica)."""
        others: dict[str, str] = {"memoryx": f"{REPLICA}-{index}", REPLICA: f"memoryx-{index}"}
        other = others.get(kind)
        return out[other].name if other is not None and other in out else None

    for role in sorted(lost, key=lambda r: (_REPLACE_ORDER.index(_kind_index(r)[0]), _kind_index(r)[1])):
        kind, index = _kind_index(role)
        old = placed.get(role)
        if old is not None and old.name in names:
            out[role] = old
            continue
        if kind == "activation" and num_workers:
            fed = out.get(f"worker-{index % num_workers}")
            if fed is not None and fed.name in names:
                out[role] = fed
                continue
        rule = rules.workers if kind in WORKER_KINDS else rules.servers
        pool = [n for n in usable if rule.admits(n)] or usable
        away = partner(kind, index)
        out[role] = min(pool, key=lambda n: (n.name == away, has("worker", n), _load(out, n)))
    return {role: out[role] for role in lost}

"""The plan of a job: how many of each role, the SwarmX tree, and which MemoryX shard holds which unit.

Pure functions of (params, model): the coordinator makes it, every role receives it inside the job JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from weightstream.numerics import ModelDef
from weightstream.params import Params, model_def

__all__ = ["REPLICA", "ROLE_KINDS", "JobSpec", "Plan", "SwarmNode", "make_plan", "process_kind"]

RoleKind = Literal["memoryx", "memoryx-replica", "swarmx", "worker", "activation"]
# a MemoryX shard's replica (``runconfig.memoryx_replicas``): a MemoryX process of its own, named apart so
# that a backend can place it away from its shard and the coordinator can tell the two apart
REPLICA: RoleKind = "memoryx-replica"
ROLE_KINDS: tuple[RoleKind, ...] = ("memoryx", REPLICA, "swarmx", "activation", "worker")


def process_kind(kind: str) -> str:
    """The role a process of ``kind`` serves (its ``weightstream <role>`` command): a replica is a MemoryX
    process, and either of a shard's two processes may serve as its primary after a fault."""
    return "memoryx" if kind == REPLICA else kind


@dataclass(frozen=True)
class SwarmNode:
    index: int
    parent: int | None  # None: the root, whose upstream is MemoryX
    children: tuple[tuple[str, int], ...]  # ("worker", w) or ("swarmx", i), in reduction order


@dataclass(frozen=True)
class Plan:
    num_csx: int
    num_wgt_servers: int
    num_act_servers: int
    fanout: int
    unit_shard: tuple[int, ...]  # unit index -> MemoryX shard that stores its owned tensors
    swarm: tuple[SwarmNode, ...]  # leaves first, root last
    worker_parent: tuple[int, ...]  # worker -> SwarmX node
    tensor_shard: dict[str, int] = field(default_factory=dict)
    memoryx_replicas: int = 0  # processes per shard beyond the first (``runconfig.memoryx_replicas``)

    @property
    def root(self) -> int:
        return len(self.swarm) - 1

    def child_slot(self, kind: str, index: int) -> int:
        """Position of a worker or SwarmX node among its parent's children (its place in the sum)."""
        parent = self.worker_parent[index] if kind == "worker" else self.swarm[index].parent
        assert parent is not None
        return self.swarm[parent].children.index((kind, index))

    def worker_activation(self, worker: int) -> int:
        return worker % self.num_act_servers

    def roles(self) -> list[tuple[str, int]]:
        """Every role of the job as (kind, index), in start order (MemoryX first, workers last)."""
        counts = self.counts()
        return [(kind, i) for kind in ROLE_KINDS for i in range(counts[kind])]

    def counts(self) -> dict[str, int]:
        return {
            "memoryx": self.num_wgt_servers,
            REPLICA: self.num_wgt_servers * self.memoryx_replicas,
            "swarmx": len(self.swarm),
            "activation": self.num_act_servers,
            "worker": self.num_csx,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        swarm = tuple(
            SwarmNode(n["index"], n["parent"], tuple((k, i) for k, i in n["children"])) for n in d["swarm"]
        )
        return Plan(
            d["num_csx"],
            d["num_wgt_servers"],
            d["num_act_servers"],
            d["fanout"],
            tuple(d["unit_shard"]),
            swarm,
            tuple(d["worker_parent"]),
            dict(d["tensor_shard"]),
            int(d.get("memoryx_replicas", 0)),
        )


def _tree(num_workers: int, fanout: int) -> tuple[tuple[SwarmNode, ...], tuple[int, ...]]:
    """Group workers into leaves of at most ``fanout``, then nodes into parents, until one root remains.
    Depth grows with log_fanout(N); a single node when N <= fanout."""
    nodes: list[dict[str, Any]] = []
    worker_parent = [0] * num_workers
    level: list[tuple[str, int]] = [("worker", w) for w in range(num_workers)]
    while True:
        groups = [level[i : i + fanout] for i in range(0, len(level), fanout)]
        new_level = []
        for g in groups:
            idx = len(nodes)
            nodes.append({"index": idx, "parent": None, "children": tuple(g)})
            for kind, i in g:
                if kind == "worker":
                    worker_parent[i] = idx
                else:
                    nodes[i]["parent"] = idx
            new_level.append(("swarmx", idx))
        if len(new_level) == 1:
            break
        level = new_level
    return tuple(SwarmNode(**n) for n in nodes), tuple(worker_parent)


def _assign_units(model: ModelDef, shards: int) -> tuple[int, ...]:
    """Whole units to shards, balanced by the bytes each unit owns (largest first to the lightest shard)."""
    owned = [sum(model.specs[n].numel for n in model.owned_by(u)) for u in range(len(model.units))]
    load = [0] * shards
    out = [0] * len(owned)
    for u in sorted(range(len(owned)), key=lambda u: (-owned[u], u)):
        s = min(range(shards), key=lambda s: (load[s], s))
        out[u] = s
        load[s] += owned[u]
    return tuple(out)


def make_plan(params: Params, model: ModelDef | None = None, num_csx: int | None = None) -> Plan:
    """The job's plan with ``num_csx`` workers (None: ``runconfig.num_csx``). A job that goes on with fewer
    workers (``runconfig.min_num_csx``) is planned again with as many: the same MemoryX shards, units and
    activation servers, the SwarmX tree of that many workers (its first nodes; the job's other SwarmX
    processes idle)."""
    model = model or model_def(params)
    rc = params.runconfig
    workers = rc.num_csx if num_csx is None else num_csx
    if not 1 <= workers <= rc.num_csx:
        raise ValueError(f"a plan of {workers} workers: the job has 1 to num_csx={rc.num_csx}")
    unit_shard = _assign_units(model, rc.num_wgt_servers)
    swarm, worker_parent = _tree(workers, rc.swarmx_fanout)
    tensor_shard = {n: unit_shard[u] for n, u in model.owners.items()}
    return Plan(
        workers,
        rc.num_wgt_servers,
        rc.num_act_servers,
        rc.swarmx_fanout,
        unit_shard,
        swarm,
        worker_parent,
        tensor_shard,
        rc.memoryx_replicas,
    )


@dataclass(frozen=True)
class JobSpec:
    """What a role is told by Configure: the resolved params, the plan, where everyone is, who it is."""

    params: dict[str, Any]
    plan: dict[str, Any]
    addresses: dict[str, list[str]]
    role: str
    index: int
    resume_dir: str | None = None
    job_id: str = ""
    # Fault recovery (``transport.fencing``): the configuration's generation, and for a MemoryX shard that
    # survived the fault, whether to keep its state (dropping only the interrupted step's gradients)
    # instead of loading ``resume_dir`` or the seed's initial weights.
    generation: int = 0
    keep_state: bool = False
    # The role plane's token, for the calls this role makes to others. Never serialised: a role gets it
    # from its token file at start (``transport.auth``), not from the job it is sent.
    credential: str = field(default="", repr=False)
    # Roles may exchange tensor bytes in shared memory, each pair where both are on one host
    # (transport/peers.py); False: every byte goes over the network (``runconfig.data_plane: grpc``)
    shared_memory: bool = False
    # a MemoryX process configured as shard ``index``'s replica: it is sent the same gradients and updates
    # as the shard and serves no weights until it takes the shard's place (training/recovery.py)
    replica: bool = False

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "credential"})

    @staticmethod
    def from_json(text: str) -> JobSpec:
        fields = json.loads(text)
        fields.pop("credential", None)
        return JobSpec(**fields)

"""What one training step asks of a cluster, read from a params file: per unit, the bytes that cross the
wire and the FLOPs a worker spends; the parameters each MemoryX shard updates; the SwarmX tree at each N.

Everything is taken from the job's own definitions rather than re-derived: ``model_def`` gives the units
and their tensors, ``make_plan`` the tree and the shards exactly as a run of that N would build them,
``params.size`` the parameter count. Only the FLOP count is new here (nothing else in weightstream needs
it): matmul FLOPs per sample from the unit's own weight shapes, backward twice forward.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from weightstream.numerics import ModelDef
from weightstream.params import Params, model_def
from weightstream.params.schema import LanguageModelParams
from weightstream.params.size import num_params
from weightstream.plan import make_plan

__all__ = ["Tree", "UnitCost", "Workload", "build_workload", "tree_of"]


@dataclass(frozen=True)
class UnitCost:
    """One streamable unit. Bytes are one copy on the wire; FLOPs are per sample."""

    name: str
    wire_bytes: int  # its weights as sent (bfloat16 halves float32 tensors when the params ask for it)
    grad_bytes: int  # its gradient as pushed up: the same tensors, the same wire type
    fwd_flops: float
    bwd_flops: float  # input and weight gradients: two matmuls per forward matmul


@dataclass(frozen=True)
class Tree:
    """The SwarmX tree of one N, as far as costs go."""

    fans: tuple[int, ...]  # per level, leaves first: the most children a node of that level has
    nodes: int  # SwarmX nodes in all: every unit crosses N + nodes links each way (MemoryX -> root too)

    @property
    def depth(self) -> int:
        return len(self.fans)


@dataclass(frozen=True)
class Workload:
    """A model and batch as the cost model sees them (plain numbers: no params, no numpy)."""

    model: str  # e.g. "gpt2 hidden 512 x 4 layers, seq 256"
    units: tuple[UnitCost, ...]
    num_params: int
    shard_params: tuple[int, ...]  # parameters each MemoryX shard updates (the plan's byte balance)
    tokens_per_sample: int  # sequence length (1 for fc_mlp): tokens/s = samples/s x this
    per_worker_batch: int | None  # weak scaling: every worker keeps this many samples per step
    global_batch: int | None  # strong scaling: this many samples per step, split over the N workers
    pipelined: bool  # runconfig.execution_mode pipelined: units cross once per step, not twice
    trees: dict[int, Tree]  # N -> its SwarmX tree
    signature: str  # identifies the unit shapes: measured per-unit times only apply to the same units

    def batch(self, n: int) -> int | None:
        """Samples per worker at ``n`` workers, or None when a held global batch does not split evenly."""
        if self.per_worker_batch is not None:
            return self.per_worker_batch
        assert self.global_batch is not None
        return self.global_batch // n if self.global_batch % n == 0 else None


def tree_of(params: Params, n: int, fanout: int, model: ModelDef | None = None) -> Tree:
    """The SwarmX tree ``make_plan`` builds for ``n`` workers at ``fanout``: per level (leaves first) the
    most children any node of that level has (depth 1 while n <= fanout), and how many nodes."""
    rc = params.runconfig.model_copy(update={"num_csx": n, "swarmx_fanout": fanout})
    plan = make_plan(params.model_copy(update={"runconfig": rc}), model or model_def(params))
    depth: dict[int, int] = {}  # node -> levels above the leaves (a leaf has only worker children)
    for node in plan.swarm:  # leaves first, root last: a node's children come before it
        below = [depth[i] + 1 for kind, i in node.children if kind == "swarmx"]
        depth[node.index] = max(below, default=0)
    fans = [0] * (max(depth.values()) + 1)
    for node in plan.swarm:
        fans[depth[node.index]] = max(fans[depth[node.index]], len(node.children))
    return Tree(tuple(fans), len(plan.swarm))


def _shard_params(params: Params, model: ModelDef, shards: int) -> tuple[int, ...]:
    rc = params.runconfig.model_copy(update={"num_wgt_servers": shards})
    plan = make_plan(params.model_copy(update={"runconfig": rc}), model)
    out = [0] * shards
    for name, shard in plan.tensor_shard.items():
        out[shard] += model.specs[name].numel
    return tuple(out)


def _unit_flops(params: Params, model: ModelDef, index: int) -> float:
    """Forward FLOPs of unit ``index`` for one sample: 2 per multiply-add of every matmul."""
    unit, m = model.units[index], params.model
    if not isinstance(m, LanguageModelParams):  # fc_mlp: one [in, out] matmul per unit and sample
        return float(
            sum(2 * model.specs[n].numel for n in unit.param_names if len(model.specs[n].shape) == 2)
        )
    t, c = params.train_input.max_sequence_length or 1, m.hidden_size
    if unit.name == "embedding":
        return 0.0  # a gather and an add: no matmul
    if unit.name == "head":
        return 2.0 * t * c * m.vocab_size  # logits = norm(x) @ head^T
    # a block: every [in, out] weight once per token, plus attention's two T x T x C products (the
    # implementation computes the full square, masked afterwards)
    matmuls = sum(model.specs[n].numel for n in unit.param_names if len(model.specs[n].shape) == 2)
    return 2.0 * t * matmuls + 4.0 * t * t * c


def _describe(params: Params) -> str:
    m = params.model
    if isinstance(m, LanguageModelParams):
        return (
            f"{m.name} hidden {m.hidden_size} x {m.num_hidden_layers} layers, vocab {m.vocab_size}, "
            f"seq {params.train_input.max_sequence_length}"
        )
    return f"fc_mlp {m.input_size}-{m.hidden_size}x{m.depth}-{m.num_classes}"


def build_workload(
    params: Params,
    ns: list[int],
    fanout: int,
    shards: int,
    per_worker_batch: int | None = None,
    hold_global_batch: bool = False,
) -> Workload:
    """The workload of ``params`` at each N of ``ns``, on a tree of ``fanout`` and ``shards`` MemoryX shards.

    Batch: by default every worker keeps the per-worker batch the params imply (``batch_size /
    runconfig.num_csx``: weak scaling, the global batch grows with N); ``per_worker_batch`` sets it;
    ``hold_global_batch`` keeps ``batch_size`` as the global batch and splits it (strong scaling, as
    ``weightstream run --num_csx N`` does)."""
    model = model_def(params)
    inp, rc = params.train_input, params.runconfig
    wire = 2 if params.model.fp16_type == "bfloat16" else 4  # every tensor of these models is float32

    def nbytes(names: tuple[str, ...]) -> int:
        return sum(model.specs[n].numel for n in names) * wire

    units = []
    for i, unit in enumerate(model.units):
        f = _unit_flops(params, model, i)
        units.append(UnitCost(unit.name, nbytes(unit.param_names), nbytes(unit.param_names), f, 2 * f))
    shapes = ";".join(f"{n}:{model.specs[n].shape}" for u in model.units for n in u.param_names)
    signature = hashlib.sha256(f"{shapes}|{inp.max_sequence_length}".encode()).hexdigest()[:16]
    if hold_global_batch:
        per_worker, global_batch = None, inp.batch_size
    else:
        per_worker, global_batch = per_worker_batch or max(1, inp.batch_size // rc.num_csx), None
    return Workload(
        model=_describe(params),
        units=tuple(units),
        num_params=num_params(params.model),
        shard_params=_shard_params(params, model, shards),
        tokens_per_sample=inp.max_sequence_length or 1,
        per_worker_batch=per_worker,
        global_batch=global_batch,
        pipelined=rc.execution_mode == "pipelined",
        trees={n: tree_of(params, n, fanout, model) for n in sorted({1, *ns})},
        signature=signature,
    )

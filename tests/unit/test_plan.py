"""The plan (plan.py): the SwarmX tree's shape for any number of workers and fan-out, and the units spread
over the MemoryX shards in balance."""

from __future__ import annotations

import pytest

from tests.params_files import TINY
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan


@pytest.mark.parametrize(
    "n,fanout,depth", [(1, 4, 1), (4, 4, 1), (5, 4, 2), (16, 4, 2), (17, 4, 3), (16, 2, 4)]
)
def test_tree_shape(n: int, fanout: int, depth: int) -> None:
    raw = {k: v for k, v in TINY.items() if k != "eval_input"}
    raw["train_input"] = {**TINY["train_input"], "batch_size": 8 * n}
    params = load_params(raw, overrides={"num_csx": n, "swarmx_fanout": fanout})
    plan = make_plan(params)
    assert all(len(node.children) <= fanout for node in plan.swarm)
    assert plan.swarm[plan.root].parent is None
    # every worker reaches the root in `depth` hops
    for w in range(n):
        node, hops = plan.worker_parent[w], 1
        while (parent := plan.swarm[node].parent) is not None:
            node, hops = parent, hops + 1
        assert hops == depth
    leaves = [("worker", w) for node in plan.swarm for kind, w in node.children if kind == "worker"]
    assert sorted(leaves) == [("worker", w) for w in range(n)]


def test_units_balanced_over_shards() -> None:
    p = load_params(
        {**TINY, "model": {**TINY["model"], "num_hidden_layers": 6}}, overrides={"num_wgt_servers": 3}
    )
    plan = make_plan(p)
    model = model_def(p)
    load = [0, 0, 0]
    for u, s in enumerate(plan.unit_shard):
        load[s] += sum(model.specs[n].numel for n in model.owned_by(u))
    assert max(load) <= 1.5 * min(load)
    assert plan.tensor_shard["transformer.wte.weight"] == plan.unit_shard[0]  # owned by the embedding

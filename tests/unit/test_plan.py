"""The plan (plan.py): the SwarmX tree's shape for any number of workers and fan-out, the units spread
over the MemoryX shards in balance, and the plan of a job gone on with fewer workers."""

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


def test_a_plan_with_fewer_workers_keeps_everything_but_the_workers_and_their_tree() -> None:
    raw = {**TINY, "train_input": {**TINY["train_input"], "batch_size": 40}}
    raw["eval_input"] = {**TINY["eval_input"], "batch_size": 40}
    params = load_params(raw, overrides={"num_csx": 5, "min_num_csx": 4, "swarmx_fanout": 4})
    full, fewer = make_plan(params), make_plan(params, num_csx=4)
    assert make_plan(params, num_csx=5) == full  # back to num_csx: the job's own plan, exactly
    assert (fewer.num_csx, len(fewer.swarm), len(full.swarm)) == (4, 1, 3)  # 4 fit one node; 5 need 2 + root
    assert fewer.worker_parent == (0, 0, 0, 0) and fewer.root == 0
    same = ("num_wgt_servers", "num_act_servers", "fanout", "unit_shard", "tensor_shard", "memoryx_replicas")
    assert all(getattr(fewer, k) == getattr(full, k) for k in same)
    for bad in (0, 6):
        with pytest.raises(ValueError, match=f"a plan of {bad} workers: the job has 1 to num_csx=5"):
            make_plan(params, num_csx=bad)

"""The roles' logic without gRPC: plan shapes, SwarmX broadcast and exact ordered reduction, MemoryX's
step protocol."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tests.integration.appliance import TINY
from weightstream.memoryx.shard import MemoryXShard, StaleStepError
from weightstream.numerics.optim import clip_coefficient
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.plan import make_plan
from weightstream.swarmx.node import SwarmNodeLogic, sum_in_order


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
        while plan.swarm[node].parent is not None:
            node, hops = plan.swarm[node].parent, hops + 1
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


class FakeUpstream:
    def __init__(self) -> None:
        self.fetches: list[tuple[int, int, int]] = []
        self.pushed: list[tuple[int, int, dict[str, np.ndarray]]] = []
        self.gate = threading.Event()

    def fetch_unit(self, step: int, unit: int, pass_: int) -> list[dict[str, np.ndarray]]:
        self.gate.wait(5)
        self.fetches.append((step, unit, pass_))
        return [{"w": np.full(3, float(step * 10 + unit), dtype=np.float32)}]

    def push_grads(self, step: int, unit: int, grads: dict[str, np.ndarray]) -> None:
        self.pushed.append((step, unit, grads))


def test_broadcast_fetches_once_per_unit_and_pass_for_all_children() -> None:
    up = FakeUpstream()
    node = SwarmNodeLogic(num_children=8, upstream=up, timeout_s=5)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(lambda: list(node.get_unit(3, 1, 0))) for _ in range(8)]
        up.gate.set()
        results = [f.result() for f in futures]
    assert up.fetches == [(3, 1, 0)]
    assert all(len(r) == 1 and np.array_equal(r[0]["w"], results[0][0]["w"]) for r in results)
    list(node.get_unit(3, 1, 1))  # the backward pass is another broadcast
    assert up.fetches == [(3, 1, 0), (3, 1, 1)]


class TrickleUpstream(FakeUpstream):
    """Yields a unit's pieces one by one, the last only when told to."""

    def fetch_unit(self, step: int, unit: int, pass_: int):  # type: ignore[no-untyped-def]
        yield "first"
        yield "second"
        self.gate.wait(5)
        yield "last"


def test_broadcast_is_cut_through_each_piece_goes_down_as_it_arrives() -> None:
    up = TrickleUpstream()
    node = SwarmNodeLogic(num_children=2, upstream=up, timeout_s=5)
    a, b = node.get_unit(0, 0, 0), node.get_unit(0, 0, 0)
    # both children have the first pieces while upstream still holds back the last
    assert [next(a), next(a), next(b)] == ["first", "second", "first"]
    up.gate.set()
    assert list(a) == ["last"] and list(b) == ["second", "last"]
    assert node.fetches_upstream == 1


def test_broadcast_error_reaches_every_child_and_a_stalled_upstream_times_out() -> None:
    class Failing(FakeUpstream):
        def fetch_unit(self, step: int, unit: int, pass_: int):  # type: ignore[no-untyped-def]
            yield "first"
            raise ConnectionError("memoryx-0 went away")

    node = SwarmNodeLogic(num_children=2, upstream=Failing(), timeout_s=5)
    for child in (node.get_unit(1, 0, 0), node.get_unit(1, 0, 0)):
        assert next(child) == "first"
        with pytest.raises(ConnectionError, match="went away"):
            next(child)
    trickle = TrickleUpstream()
    stalled = SwarmNodeLogic(num_children=1, upstream=trickle, timeout_s=0.2)
    child = stalled.get_unit(2, 0, 0)
    assert [next(child), next(child)] == ["first", "second"]
    with pytest.raises(TimeoutError, match="nothing more received"):
        next(child)
    trickle.gate.set()  # let its puller thread finish


@pytest.mark.parametrize("children", [1, 2, 3, 7, 16])
def test_reduce_is_exact_and_independent_of_arrival_order(children: int, rng) -> None:
    grads = [
        {
            "a": rng.standard_normal(50).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3)),
            "b": rng.standard_normal((4, 4)).astype(np.float32),
        }
        for _ in range(children)
    ]
    expected = sum_in_order(grads)
    for order in (range(children), reversed(range(children)), rng.permutation(children)):
        up = FakeUpstream()
        node = SwarmNodeLogic(children, up, timeout_s=5)
        for c in order:
            node.push_grads(0, 2, int(c), grads[c])
        [(step, unit, out)] = up.pushed
        assert (step, unit) == (0, 2)
        for k in expected:
            assert_array_equal(out[k], expected[k])  # bitwise: child order, not arrival order
    exact = np.sum([g["a"].astype(np.float64) for g in grads], axis=0)
    np.testing.assert_allclose(expected["a"], exact, rtol=1e-5, atol=1e-4)


def test_reduce_rejects_duplicates_and_bad_children() -> None:
    node = SwarmNodeLogic(2, FakeUpstream(), timeout_s=5)
    node.push_grads(0, 0, 0, {"w": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="twice"):
        node.push_grads(0, 0, 0, {"w": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="out of range"):
        node.push_grads(0, 0, 2, {"w": np.zeros(1, dtype=np.float32)})


def _shard(storage: Path | None = None) -> tuple[MemoryXShard, object]:
    p = load_params(TINY)
    model = model_def(p)
    opt = optimizer_config(p.optimizer)
    return MemoryXShard(model, opt, list(model.specs), seed=7, timeout_s=2, storage_dir=storage), model


@pytest.fixture(params=["memory", "disk"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """A shard's tensors in RAM, or in files under tmp_path (runconfig.memoryx_storage: disk)."""
    return tmp_path / "memoryx" if request.param == "disk" else None


def test_memoryx_step_protocol(rng, storage: Path | None) -> None:
    shard, model = _shard(storage)
    before = {n: w.copy() for n, w in shard.tensors(0, list(model.specs))}
    for u, unit in enumerate(model.units):
        shard.add_gradient(
            0, u, {n: rng.standard_normal(model.specs[n].shape).astype(np.float32) for n in unit.param_names}
        )
    sq = shard.grad_sq_sum(0)
    assert sq > 0 and shard.grad_sq_sum(0) == sq  # repeatable
    assert shard.apply_update(0, lr=1e-3, clip_coef=0.5) is True
    assert shard.apply_update(0, lr=1e-3, clip_coef=0.5) is False  # applied exactly once
    after = dict(shard.tensors(1, ["transformer.wte.weight"]))
    assert not np.array_equal(after["transformer.wte.weight"], before["transformer.wte.weight"])
    with pytest.raises(StaleStepError):
        shard.tensors(0, ["transformer.wte.weight"])
    with pytest.raises(StaleStepError):
        shard.add_gradient(0, 0, {})


def test_memoryx_waits_for_every_gradient_including_both_uses_of_a_tied_tensor(
    rng, storage: Path | None
) -> None:
    shard, model = _shard(storage)
    for u, unit in enumerate(model.units[:-1]):  # the head's gradient (with its share of wte) is missing
        shard.add_gradient(0, u, {n: np.ones(model.specs[n].shape, np.float32) for n in unit.param_names})
    with pytest.raises(TimeoutError, match=r"transformer.wte.weight.*\[3\]"):
        shard.grad_sq_sum(0)
    with pytest.raises(ValueError, match="does not use"):
        shard.add_gradient(0, 1, {"transformer.wte.weight": np.ones((64, 32), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        shard.add_gradient(0, 3, {"transformer.ln_f.weight": np.ones(5, np.float32)})


def test_memoryx_apply_update_matches_torch_adamw_for_two_steps(rng, storage: Path | None) -> None:
    """ApplyUpdate's magnitude, not only that weights moved: a shard holding every tensor of TINY, fed a
    known gradient for every unit, clips and steps exactly as torch.optim.AdamW (TINY's betas, eps and
    weight decay; none on biases and LayerNorm weights) does on the same initial weights with the same
    summed, clipped gradients, for two consecutive steps with their own learning rates; the tied
    embedding gets the sum of both units' parts; grad_sq_sum is the float64 sum of squares of the
    summed gradients."""
    torch = pytest.importorskip(
        "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
    )
    shard, model = _shard(storage)
    opt = optimizer_config(load_params(TINY).optimizer)
    assert (opt.kind, opt.betas, opt.weight_decay) == ("adamw", (0.9, 0.95), 0.01)  # what TINY asks for
    names = list(model.specs)
    assert [u for u, unit in enumerate(model.units) if "transformer.wte.weight" in unit.param_names] == [0, 3]
    ref = {n: torch.nn.Parameter(torch.from_numpy(w.copy())) for n, w in shard.tensors(0, names)}
    # ModelZoo's parameter groups: no decay on biases and LayerNorm weights
    no_decay = [n for n in names if n.endswith(".bias") or ".ln_" in n]
    assert len(no_decay) == 8 * 2 + 2 and opt.weight_decay_for(no_decay[0]) == 0.0
    torch_opt = torch.optim.AdamW(
        [
            {"params": [p for n, p in ref.items() if n not in no_decay]},
            {"params": [p for n, p in ref.items() if n in no_decay], "weight_decay": 0.0},
        ],
        lr=1.0,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=False,
    )
    # not the schedule's: its step 0 has lr 0, which would hide the update; each step has its own lr
    for step, lr in ((0, 2e-3), (1, 3e-3)):
        summed: dict[str, np.ndarray] = {}
        for u, unit in enumerate(model.units):
            parts = {
                n: rng.standard_normal(model.specs[n].shape).astype(np.float32) for n in unit.param_names
            }
            # copies: the shard keeps the arrays it is given and clips them in place
            shard.add_gradient(step, u, {n: g.copy() for n, g in parts.items()})
            for n, g in parts.items():
                summed[n] = summed[n] + g if n in summed else g  # wte: embedding's part + head's part
        expected_sq = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in summed.values())
        sq = shard.grad_sq_sum(step)
        assert sq == pytest.approx(expected_sq, rel=1e-12)
        _, coef = clip_coefficient([sq], opt.max_gradient_norm)
        assert coef < 1.0  # unit-normal gradients of ~20k numbers (norm ~150): clipping is on
        assert shard.apply_update(step, lr=lr, clip_coef=coef) is True
        for n, p in ref.items():
            p.grad = torch.from_numpy(summed[n] * np.float32(coef))  # clipped in float32, as the shard does
        for group in torch_opt.param_groups:
            group["lr"] = lr
        torch_opt.step()
        assert shard.step == step + 1
        for n, p in ref.items():
            got = shard.weight(n)
            assert_allclose(got, p.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=f"{n}, step {step}")
            state = shard.state(n)
            for k in ("exp_avg", "exp_avg_sq"):
                expected = torch_opt.state[p][k].numpy()
                assert_allclose(state[k], expected, rtol=1e-6, atol=1e-9, err_msg=f"{n}.{k}, step {step}")
    if storage is not None:  # the tensors are in files there, and the files hold what the shard returns
        w = "transformer.h.0.attn.c_attn.weight"
        on_disk = np.fromfile(storage / f"{w}.f32", dtype=np.float32).reshape(model.specs[w].shape)
        assert np.array_equal(on_disk, shard.weight(w))
        assert (storage / f"{w}.exp_avg_sq.f32").stat().st_size == on_disk.nbytes

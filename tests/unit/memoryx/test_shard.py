"""A MemoryX shard's step protocol without gRPC (memoryx/shard.py): gradients in, the sum of squares, one
update per step, stale steps refused, a wait for every gradient of a tied tensor, and the update equal to
torch's AdamW, with the tensors in memory or on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.memoryx_shards import tiny_shard
from tests.params_files import TINY
from weightstream.memoryx.shard import StaleStepError
from weightstream.numerics.optim import clip_coefficient
from weightstream.params import load_params, optimizer_config


def test_memoryx_step_protocol(rng, storage: Path | None) -> None:
    shard, model = tiny_shard(timeout_s=2, storage=storage)
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
    shard, model = tiny_shard(
        timeout_s=0.2, storage=storage
    )  # it times out: how long it waits is not the point
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
    shard, model = tiny_shard(timeout_s=2, storage=storage)
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

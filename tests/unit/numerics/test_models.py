"""Whole models: loss and every parameter gradient against an independent PyTorch reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.model_checks import assert_grads_match_finite_differences, assert_shards_sum_to_global
from weightstream.numerics import (
    FCMLPConfig,
    GPT2Config,
    build_fc_mlp,
    build_gpt2,
    forward_backward,
    init_params,
)

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
from tests import torch_reference as ref  # noqa: E402

CFG = GPT2Config(vocab_size=37, n_positions=12, n_embd=16, n_layer=3, n_head=4, n_inner=40)


def _batch(
    rng: np.random.Generator, cfg: GPT2Config, b: int = 3, t: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, cfg.vocab_size, (b, t + 1))
    return ids[:, :-1], ids[:, 1:]


def _perturbed(params: dict[str, np.ndarray], rng: np.random.Generator, dtype) -> dict[str, np.ndarray]:
    """Initial LayerNorm/bias values are 1/0; perturb them so their gradients are exercised fully."""
    return {n: (v + 0.05 * rng.standard_normal(v.shape)).astype(dtype) for n, v in params.items()}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize(
    "dtype,rtol,atol", [(np.float64, 1e-5, 1e-6), (np.float32, 1e-3, 2e-5)], ids=["float64", "float32"]
)
def test_gpt2_loss_and_grads_match_torch(tied: bool, dtype, rtol: float, atol: float, rng) -> None:
    cfg = GPT2Config(**{**CFG.__dict__, "tie_word_embeddings": tied})
    model = build_gpt2(cfg)
    params = _perturbed(init_params(model, seed=3), rng, dtype)
    ids, targets = _batch(rng, cfg)
    loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)

    tp = ref.to_torch(params, torch.float64 if dtype == np.float64 else torch.float32)
    logits = ref.gpt2_logits(tp, torch.as_tensor(ids), cfg.n_layer, cfg.n_head, cfg.layer_norm_epsilon, tied)
    ref_loss, ref_grads = ref.loss_and_grads(tp, logits, targets)

    assert_allclose(loss, ref_loss, rtol=rtol)
    assert set(grads) == set(ref_grads) == set(model.specs)
    for name in model.specs:
        assert grads[name].dtype == dtype, name
        assert_allclose(grads[name], ref_grads[name], rtol=rtol, atol=atol, err_msg=name)


def test_gpt2_grads_match_finite_differences(rng) -> None:
    cfg = GPT2Config(vocab_size=7, n_positions=5, n_embd=8, n_layer=2, n_head=2, n_inner=12)
    model = build_gpt2(cfg)
    params = _perturbed(init_params(model, seed=0), rng, np.float64)
    ids, targets = _batch(rng, cfg, b=2, t=4)
    assert_grads_match_finite_differences(model, params, ids, targets, rng, atol=1e-7)


def test_fc_mlp_matches_torch(rng) -> None:
    cfg = FCMLPConfig(input_size=12, hidden_sizes=(20, 16), num_classes=5)
    model = build_fc_mlp(cfg)
    params = {n: v.astype(np.float64) for n, v in init_params(model, seed=5).items()}
    x = rng.standard_normal((9, 12))
    y = rng.integers(0, 5, 9)
    loss, grads = forward_backward(model, params, x, y, denom=y.size)
    tp = ref.to_torch(params, torch.float64)
    ref_loss, ref_grads = ref.loss_and_grads(tp, ref.fc_mlp_logits(tp, torch.as_tensor(x), depth=2), y)
    assert_allclose(loss, ref_loss, rtol=1e-10)
    for name in model.specs:
        assert_allclose(grads[name], ref_grads[name], rtol=1e-8, atol=1e-12, err_msg=name)


def test_shard_gradients_sum_to_global_gradient(rng) -> None:
    """What makes data parallelism exact: shards with the global denominator add up to the full batch."""
    model = build_gpt2(CFG)
    params = {n: v.astype(np.float64) for n, v in init_params(model, seed=2).items()}
    assert_shards_sum_to_global(model, params, *_batch(rng, CFG, b=4))


def test_units_and_ownership() -> None:
    model = build_gpt2(CFG)
    assert [u.name for u in model.units] == ["embedding", "h.0", "h.1", "h.2", "head"]
    # the tied embedding is read by the first and the last unit, stored once, with the first
    assert model.owners["transformer.wte.weight"] == 0
    assert "transformer.wte.weight" in model.units[-1].param_names
    assert "transformer.wte.weight" not in model.owned_by(len(model.units) - 1)
    assert sum(len(model.owned_by(i)) for i in range(len(model.units))) == len(model.specs)
    expected = (
        CFG.vocab_size * 16
        + 12 * 16
        + 3 * (4 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 40 + 40 + 40 * 16 + 16)
    )
    assert model.num_params == expected + 2 * 16


def test_init_is_gpt2_style_and_deterministic() -> None:
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=6, n_head=4, n_inner=512)
    model = build_gpt2(cfg)
    a = init_params(model, seed=11)
    b = init_params(model, seed=11)
    assert all(np.array_equal(a[n], b[n]) and a[n].dtype == np.float32 for n in a)
    c = init_params(model, seed=12)
    assert not np.array_equal(a["transformer.wte.weight"], c["transformer.wte.weight"])
    # a shard initialising only its own tensors gets exactly the same values
    part = init_params(model, seed=11, names=["transformer.h.3.mlp.c_fc.weight"])
    assert np.array_equal(part["transformer.h.3.mlp.c_fc.weight"], a["transformer.h.3.mlp.c_fc.weight"])
    # ModelZoo's default: normal(0, 0.02) cut at 2 std (whose std is 0.87962566 of the uncut one), the
    # residual projections' std and bounds scaled by 1/sqrt(2 n_layer)
    for n, std in (
        ("transformer.wte.weight", 0.02),
        ("transformer.h.0.attn.c_proj.weight", 0.02 / math.sqrt(12)),
        ("transformer.h.0.mlp.c_proj.weight", 0.02 / math.sqrt(12)),
    ):
        assert abs(a[n].std() / (0.87962566 * std) - 1) < 0.03, n
        assert np.abs(a[n]).max() <= np.float32(2 * std) and np.abs(a[n]).max() > 1.95 * std, n
    assert not a["transformer.h.0.attn.c_attn.bias"].any()
    assert (a["transformer.h.0.ln_1.weight"] == 1).all()


def test_the_reference_loss_writes_over_the_logits(rng, monkeypatch: pytest.MonkeyPatch) -> None:
    """forward_backward and forward_loss (the in-process reference, evaluation) give the loss the logits
    to overwrite: no vocabulary-sized buffer of its own."""
    import weightstream.numerics.layers as layers_module
    import weightstream.numerics.model as model_module

    real = layers_module.cross_entropy_forward  # what model.py calls
    seen: list[bool] = []

    def spy(logits: np.ndarray, *args, **kw):
        out = real(logits, *args, **kw)
        seen.append(np.shares_memory(out[1][0], logits))
        return out

    monkeypatch.setattr(model_module, "cross_entropy_forward", spy)
    model = build_gpt2(CFG)
    params = init_params(model, seed=0)
    x, y = _batch(rng, CFG)
    forward_backward(model, params, x, y, y.size)
    model_module.forward_loss(model, params, x, y, y.size)
    assert seen == [True, True]

"""The whole LLaMA model (numerics/llama.py): loss and every gradient against Hugging Face's
``LlamaForCausalLM``, safetensors through ``from_pretrained``, shards, units, init, determinism."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.model_checks import assert_grads_match_finite_differences, assert_shards_sum_to_global
from weightstream.numerics import (
    LlamaConfig,
    ModelDef,
    build_llama,
    forward_backward,
    forward_loss,
    init_params,
)

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
F = torch.nn.functional


def _perturbed(model: ModelDef, rng: np.random.Generator, dtype, names=None) -> dict[str, np.ndarray]:
    """Initial norm/bias values are 1/0; perturb them so their gradients are exercised fully."""
    params = init_params(model, seed=3, names=names)
    return {n: (v + 0.05 * rng.standard_normal(v.shape)).astype(dtype) for n, v in params.items()}


# ---------------------------------------------------------------------------------------------------------
# The whole model
# ---------------------------------------------------------------------------------------------------------
CFG = LlamaConfig(
    vocab_size=37,
    max_position_embeddings=12,
    hidden_size=16,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=24,
    rms_norm_eps=1e-4,  # non-default, and it matters: the embeddings' mean square is ~3e-3
    rope_theta=500.0,
)


def _cfg(**kw) -> LlamaConfig:
    return LlamaConfig(**{**CFG.__dict__, **kw})


def _batch(rng: np.random.Generator, cfg: LlamaConfig, b: int = 3, t: int = 10):
    ids = rng.integers(0, cfg.vocab_size, (b, t + 1))
    return ids[:, :-1], ids[:, 1:]


def _logits(model: ModelDef, params, ids: np.ndarray) -> np.ndarray:
    x = ids
    for unit in model.units:
        x, _ = unit.forward(params, x)
    return x


def _hf_config(cfg: LlamaConfig):
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        initializer_range=cfg.initializer_range,
        attention_bias=cfg.attention_bias,
        mlp_bias=cfg.mlp_bias,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attn_implementation="eager",
    )


def _hf_model(cfg: LlamaConfig, params: dict[str, np.ndarray], dtype):
    """LlamaForCausalLM with our tensors loaded into its state_dict by name."""
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    hf = transformers.LlamaForCausalLM(_hf_config(cfg))
    hf = hf.double() if dtype == np.float64 else hf.float()
    state = hf.state_dict()
    # the same tensors, in the same order (a tied head's lm_head.weight is the embedding itself)
    names = [n for n in state if not (cfg.tie_word_embeddings and n == "lm_head.weight")]
    assert names == list(params)
    with torch.no_grad():
        for n, v in params.items():
            assert tuple(state[n].shape) == v.shape, n
            state[n].copy_(torch.from_numpy(v))
    return hf


# HF computes RMSNorm, rotary angles and the softmax in float32 even in a .double() model, so "float64"
# agrees to float32 rounding (measured: within 9e-7 of each tensor's largest gradient); the tests above
# check our float64 to 1e-10 against float64 references. (dtype, rtol, atol as a fraction of that largest)
HF_TOLERANCES = {np.float64: (1e-5, 5e-6), np.float32: (1e-4, 2e-5)}
_BIASES = {
    "nobias": (False, False),
    "bias": (True, True),
    "attn_bias": (True, False),
    "mlp_bias": (False, True),
}
HF_GRID = [
    pytest.param(
        dtype, kv, _BIASES[b], tied, id=f"{dtype.__name__}-{kv_id}-{b}-{'tied' if tied else 'untied'}"
    )
    for dtype in (np.float64, np.float32)
    for kv, kv_id in ((4, "mha"), (2, "gqa"), (1, "mqa"))
    # float32 runs the main grid; each bias alone is covered in float64
    for b in (_BIASES if dtype == np.float64 else ("nobias", "bias"))
    for tied in (False, True)
]


@pytest.mark.parametrize("dtype,kv,bias,tied", HF_GRID)
def test_loss_and_every_grad_match_hf_llama(dtype, kv: int, bias: tuple[bool, bool], tied: bool, rng) -> None:
    cfg = _cfg(num_kv_heads=kv, attention_bias=bias[0], mlp_bias=bias[1], tie_word_embeddings=tied)
    model = build_llama(cfg)
    params = _perturbed(model, rng, dtype)
    ids, targets = _batch(rng, cfg)
    loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)

    hf = _hf_model(cfg, params, dtype)
    logits = hf(input_ids=torch.as_tensor(ids)).logits
    ref_loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref_loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in hf.named_parameters()}  # a tied head is listed once

    rtol, atol = HF_TOLERANCES[dtype]
    assert_allclose(loss, ref_loss.item(), rtol=rtol)
    assert set(grads) == set(ref_grads) == set(model.specs)
    for name in model.specs:
        assert grads[name].dtype == dtype, name
        scale = np.abs(ref_grads[name]).max()  # atol relative to the tensor's gradient scale
        assert_allclose(grads[name], ref_grads[name], rtol=rtol, atol=atol * scale, err_msg=name)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_safetensors_load_with_from_pretrained(tied: bool, tmp_path: Path, rng) -> None:
    """Our tensors, saved as they are, are a checkpoint ``LlamaForCausalLM.from_pretrained`` takes whole."""
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="installed with transformers")
    cfg = _cfg(attention_bias=True, mlp_bias=True, tie_word_embeddings=tied)
    model = build_llama(cfg)
    params = _perturbed(model, rng, np.float32)
    _hf_config(cfg).save_pretrained(tmp_path)
    safetensors_numpy.save_file(params, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"
    hf, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    ids, _ = _batch(rng, cfg)
    with torch.no_grad():
        ref = hf(input_ids=torch.as_tensor(ids)).logits.numpy()
    assert_allclose(_logits(model, params, ids), ref, rtol=1e-4, atol=1e-5)


def test_whole_model_grads_match_finite_differences(rng) -> None:
    cfg = _cfg(num_kv_heads=1, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    model = build_llama(cfg)
    params = _perturbed(model, rng, np.float64)
    ids, targets = _batch(rng, cfg, b=2, t=5)
    assert_grads_match_finite_differences(model, params, ids, targets, rng, atol=1e-8)


def test_shard_gradients_sum_to_global_gradient(rng) -> None:
    """What makes data parallelism exact: shards with the global denominator add up to the full batch."""
    model = build_llama(_cfg(tie_word_embeddings=True))
    params = {n: v.astype(np.float64) for n, v in init_params(model, seed=2).items()}
    assert_shards_sum_to_global(model, params, *_batch(rng, CFG, b=4))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_units_ownership_and_size(tied: bool) -> None:
    cfg = _cfg(attention_bias=True, mlp_bias=True, tie_word_embeddings=tied)
    model = build_llama(cfg)
    assert model.family == "llama"
    assert [u.name for u in model.units] == ["embedding", "layers.0", "layers.1", "head"]
    emb, head = "model.embed_tokens.weight", len(model.units) - 1
    assert model.owners[emb] == 0
    assert (emb in model.units[head].param_names) == tied
    assert emb not in model.owned_by(head)
    assert ("lm_head.weight" in model.specs) != tied
    assert model.units[1].param_names == tuple(n for n in model.specs if n.startswith("model.layers.0."))
    assert sum(len(model.owned_by(i)) for i in range(len(model.units))) == len(model.specs)
    c, f, kvd, v = 16, 24, 2 * 4, 37
    layer = 2 * c + 2 * c * c + 2 * kvd * c + 3 * c * f + (2 * c + 2 * kvd) + (2 * f + c)
    assert model.num_params == v * c * (1 if tied else 2) + 2 * layer + c
    hf = pytest.importorskip("transformers").LlamaForCausalLM(_hf_config(cfg))
    assert model.num_params == sum(p.numel() for p in hf.parameters())  # a tied tensor counted once


def test_init_is_modelzoo_style_and_deterministic() -> None:
    cfg = LlamaConfig(
        vocab_size=512,
        max_position_embeddings=64,
        hidden_size=128,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=344,
        initializer_range=0.03,
        attention_bias=True,
        mlp_bias=True,
    )
    model = build_llama(cfg)
    a, b = init_params(model, seed=11), init_params(model, seed=11)
    assert all(np.array_equal(a[n], b[n]) and a[n].dtype == np.float32 for n in a)
    c = init_params(model, seed=12)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    name = "model.layers.3.mlp.down_proj.weight"
    assert np.array_equal(init_params(model, seed=11, names=[name])[name], a[name])  # a shard's own tensors
    # ModelZoo's default (its LLaMA is its GPT-2): normal(0, initializer_range) cut at 2 std, o_proj and
    # down_proj with std and bounds scaled by 1/sqrt(2 num_layers); the untied head normal, uncut
    for n, std in (
        ("model.embed_tokens.weight", 0.03),
        ("model.layers.0.self_attn.q_proj.weight", 0.03),
        ("model.layers.0.self_attn.o_proj.weight", 0.03 / math.sqrt(12)),
        (name, 0.03 / math.sqrt(12)),
    ):
        assert abs(a[n].std() / (0.87962566 * std) - 1) < 0.03, n
        assert abs(a[n].mean()) < 0.05 * std, n
        assert np.abs(a[n]).max() <= np.float32(2 * std) and np.abs(a[n]).max() > 1.95 * std, n
    head = a["lm_head.weight"]
    assert abs(head.std() / 0.03 - 1) < 0.03 and np.abs(head).max() > 3 * 0.03
    assert a["model.layers.0.self_attn.k_proj.weight"].shape == (64, 128)
    assert (
        not a["model.layers.0.self_attn.q_proj.bias"].any() and not a["model.layers.5.mlp.up_proj.bias"].any()
    )
    assert (a["model.layers.0.input_layernorm.weight"] == 1).all() and (a["model.norm.weight"] == 1).all()


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"hidden_size": 18}, "hidden_size 18 is not a multiple of num_heads 4"),
        ({"num_kv_heads": 3}, "num_heads 4 is not a multiple of num_kv_heads 3"),
        ({"hidden_size": 12}, "head_dim = hidden_size / num_heads = 3 must be even"),
        ({"num_kv_heads": 0}, "num_kv_heads must be at least 1"),
    ],
)
def test_bad_config_is_refused_naming_the_field(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(**kw)


def test_sequence_longer_than_max_positions_is_refused(rng) -> None:
    model = build_llama(CFG)
    params = init_params(model, seed=0)
    ids = rng.integers(0, CFG.vocab_size, (1, CFG.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="sequence length 13 exceeds max_position_embeddings 12"):
        forward_loss(model, params, ids, ids, ids.size)
    assert math.isfinite(forward_loss(model, params, ids[:, :-1], ids[:, 1:], ids.size))

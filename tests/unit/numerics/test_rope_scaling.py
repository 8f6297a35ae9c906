"""RoPE scaling for LLaMA (numerics/rope_scaling.py, ModelZoo's pos_scaling_type/factor/extra_args): the
frequencies against transformers' own functions, a whole model's loss and gradients against a scaled
``LlamaForCausalLM``, the config.json we export read back by transformers, the starting-checkpoint check,
and the params' errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.torch_reference import hf_inv_freq
from weightstream.numerics import LlamaConfig, build_llama, forward_backward, init_params
from weightstream.numerics.rope_scaling import (
    RopeScaling,
    make_rope_scaling,
    rope_inv_freq,
)

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils", reason="transformers' RoPE functions")
F = torch.nn.functional

# with head size 8 or 16 and theta 10000: one frequency kept, one or two blended, the rest scaled
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _hf_config(head_dim: int, theta: float, rope: dict[str, Any] | None, **kw: Any) -> Any:
    """A transformers LlamaConfig of ``head_dim`` (2 heads) whose rope_parameters are ``rope`` (None:
    plain RoPE), spelled as transformers 5 writes it."""
    params = {"rope_type": "default", **(rope or {}), "rope_theta": theta}
    shape = {"hidden_size": 2 * head_dim, "num_attention_heads": 2, "num_hidden_layers": 1}
    return transformers.LlamaConfig(
        **({"vocab_size": 8, "intermediate_size": 8, "max_position_embeddings": 64} | shape | kw),
        rope_parameters=params,
    )


# ---------------------------------------------------------------------------------------------------------
# The frequencies
# ---------------------------------------------------------------------------------------------------------
def _l3(low: float, high: float, context: int) -> dict[str, Any]:
    return {"low_freq_factor": low, "high_freq_factor": high, "original_max_position_embeddings": context}


INV_FREQ_CASES = [
    pytest.param(16, 10000.0, "linear", 2.0, {}, id="linear-2"),
    pytest.param(64, 500000.0, "linear", 4.0, {}, id="linear-4-theta5e5"),
    pytest.param(6, 100.0, "linear", 0.5, {}, id="linear-0.5"),
    pytest.param(16, 10000.0, "llama3", 4.0, LLAMA3, id="llama3-small"),
    # Llama 3.2's settings (factor 32, 8192 positions), at its real head size
    pytest.param(128, 500000.0, "llama3", 32.0, _l3(1.0, 4.0, 8192), id="llama3-3.2"),
    pytest.param(32, 500.0, "llama3", 8.0, _l3(2.0, 3.0, 100), id="llama3-narrow-band"),
]


@pytest.mark.parametrize("head_dim,theta,kind,factor,extra", INV_FREQ_CASES)
def test_inv_freq_equals_transformers(
    head_dim: int, theta: float, kind: str, factor: float, extra: dict[str, Any]
) -> None:
    """Ours are float64 from correctly rounded powers, transformers' float32: equal to 1e-6 relative."""
    scaling = make_rope_scaling(kind, factor, extra)
    ours = rope_inv_freq(head_dim, theta, scaling)
    theirs = hf_inv_freq(_hf_config(head_dim, theta, {"rope_type": kind, "factor": factor, **extra}))
    assert ours.dtype == np.float64 and ours.shape == theirs.shape == (head_dim // 2,)
    assert_allclose(ours, theirs, rtol=1e-6)
    plain = rope_inv_freq(head_dim, theta)
    if kind == "llama3":  # every case above keeps its shortest wave and scales its longest by the factor
        assert ours[0] == plain[0] and ours[-1] == plain[-1] / factor


@pytest.mark.parametrize("head_dim", [8, 16])
def test_llama3_cases_cover_all_three_bands(head_dim: int) -> None:
    """LLAMA3 at head size 8 (the model test) and 16 (the frequency test) has a kept, a blended and a
    scaled frequency, so each piece is compared."""
    plain = rope_inv_freq(head_dim, 10000.0)
    ratio = plain / rope_inv_freq(head_dim, 10000.0, make_rope_scaling("llama3", 4.0, LLAMA3))
    assert ratio[0] == 1.0 and ratio[-1] == 4.0
    assert np.any((ratio > 1.01) & (ratio < 3.99)), ratio  # blended


def test_unscaled_frequencies_are_bitwise_todays() -> None:
    """No scaling, and linear by 1.0 (the params' default), leave the plain theta powers bit for bit."""
    d, theta = 16, 500.0
    today = float(theta) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    assert np.array_equal(rope_inv_freq(d, theta), today)
    assert make_rope_scaling("linear", 1.0) is None and make_rope_scaling("linear", 1) is None
    assert make_rope_scaling("llama3", 1.0, LLAMA3) is not None  # llama3 by 1 still blends: kept as asked


# ---------------------------------------------------------------------------------------------------------
# A whole model against a scaled LlamaForCausalLM
# ---------------------------------------------------------------------------------------------------------
SCALINGS = {
    "linear": make_rope_scaling("linear", 3.0),
    "llama3": make_rope_scaling("llama3", 4.0, LLAMA3),
}


def _cfg(scaling: RopeScaling | None) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=37,
        max_position_embeddings=32,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=24,
        rms_norm_eps=1e-4,
        rope_theta=10000.0,
        rope_scaling=scaling,
    )


def _hf_model(cfg: LlamaConfig, params: dict[str, np.ndarray]) -> Any:
    rope = (
        {}
        if cfg.rope_scaling is None
        else {"rope_type": cfg.rope_scaling.kind, **cfg.rope_scaling.hf_fields()}
    )
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", **rope, "rope_theta": cfg.rope_theta},
        attn_implementation="eager",
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).double()
    state = hf.state_dict()
    assert list(state) == list(params)
    with torch.no_grad():
        for n, v in params.items():
            state[n].copy_(torch.from_numpy(v))
    return hf


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_scaled_model_loss_and_grads_equal_transformers(kind: str, rng: np.random.Generator) -> None:
    """float64 both sides (transformers' rotary angles stay float32): loss to 1e-5 relative, every
    gradient too; q and k are large enough that the scaling moves the loss well beyond that."""
    cfg = _cfg(SCALINGS[kind])
    model = build_llama(cfg)
    params = {n: v.astype(np.float64) for n, v in init_params(model, seed=5).items()}
    for n in params:
        if "q_proj" in n or "k_proj" in n:
            params[n] = 0.5 * rng.standard_normal(params[n].shape)  # attention that depends on position
        elif "v_proj" in n or "o_proj" in n:  # and carries enough of the output (o_proj's default is
            params[n] *= 2.0  # ModelZoo's, scaled by 1/sqrt(2 num_layers))
    ids = rng.integers(0, cfg.vocab_size, (2, 29))  # 28 positions
    inputs, targets = ids[:, :-1], ids[:, 1:]
    loss, grads = forward_backward(model, params, inputs, targets, denom=targets.size)

    hf = _hf_model(cfg, params)
    logits = hf(input_ids=torch.as_tensor(inputs)).logits
    ref = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-5)
    for n, p in hf.named_parameters():
        scale = np.abs(p.grad.numpy()).max()
        assert_allclose(grads[n], p.grad.numpy(), rtol=1e-5, atol=5e-6 * scale, err_msg=n)
    plain_loss, _ = forward_backward(build_llama(_cfg(None)), params, inputs, targets, denom=targets.size)
    assert abs(plain_loss - loss) > 1e-3 * loss, "the scaling must matter to this test"

"""LLaMA's layers (numerics/llama_layers.py) and one decoder layer: against PyTorch autograd (float64) and
finite differences, every KV grouping, the fused and in-place paths."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
from numpy.testing import assert_allclose

from weightstream.numerics import (
    LlamaConfig,
    ModelDef,
    build_llama,
    init_params,
)
from weightstream.numerics import llama_layers as LL

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
from tests import torch_reference as ref  # noqa: E402

F = torch.nn.functional

# Layer tests: sizes small enough for finite differences over every entry; eps large enough to matter.
B, T, H, KV, D, INNER = 2, 5, 4, 2, 6, 16
C = H * D
EPS, THETA = 0.05, 100.0  # a non-default theta, so its plumbing is exercised
TOLERANCES = [(np.float64, 1e-10, 1e-12), (np.float32, 2e-4, 2e-5)]


# ---------------------------------------------------------------------------------------------------------
# Independent PyTorch references (token-major, Hugging Face's formulas, float64 throughout)
# ---------------------------------------------------------------------------------------------------------
def _rms_ref(x, w, eps: float):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope_ref(x, theta: float):
    """x [B, heads, T, D] rotated the HF way: x * cos + rotate_half(x) * sin."""
    d, t = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos().to(x.dtype) + torch.cat((-x2, x1), dim=-1) * emb.sin().to(x.dtype)


def _decoder_ref(x, p: dict, prefix: str, cfg: LlamaConfig):
    def lin(h, module: str):
        return F.linear(h, p[f"{prefix}{module}.weight"], p.get(f"{prefix}{module}.bias"))

    b, t, c = x.shape
    h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    z = _rms_ref(x, p[prefix + "input_layernorm.weight"], cfg.rms_norm_eps)
    q = _rope_ref(lin(z, "self_attn.q_proj").view(b, t, h, d).transpose(1, 2), cfg.rope_theta)
    k = _rope_ref(lin(z, "self_attn.k_proj").view(b, t, kv, d).transpose(1, 2), cfg.rope_theta)
    v = lin(z, "self_attn.v_proj").view(b, t, kv, d).transpose(1, 2)
    k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
    x = x + lin(a, "self_attn.o_proj")
    z = _rms_ref(x, p[prefix + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    return x + lin(F.silu(lin(z, "mlp.gate_proj")) * lin(z, "mlp.up_proj"), "mlp.down_proj")


def _rope_t_ref(x_t):
    """Feature-major [H * D, B * T] through the token-major reference and back."""
    y = _rope_ref(x_t.reshape(H, D, B, T).permute(2, 0, 3, 1), THETA)  # [B, H, T, D]
    return y.permute(1, 3, 0, 2).reshape(H * D, B * T)


# ---------------------------------------------------------------------------------------------------------
# Layer cases: name -> (make inputs(rng, dtype), numpy fwd+bwd(*inputs, dy) -> (y, [grads]), torch fn)
# ---------------------------------------------------------------------------------------------------------
LAYER_CFG = LlamaConfig(
    vocab_size=11,
    max_position_embeddings=T,
    hidden_size=C,
    num_layers=1,
    num_heads=H,
    num_kv_heads=KV,
    intermediate_size=INNER,
    rms_norm_eps=EPS,
    rope_theta=THETA,
    attention_bias=True,
    mlp_bias=True,
)
LAYER = build_llama(LAYER_CFG).units[1]


def _perturbed(model: ModelDef, rng: np.random.Generator, dtype, names=None) -> dict[str, np.ndarray]:
    """Initial norm/bias values are 1/0; perturb them so their gradients are exercised fully."""
    params = init_params(model, seed=3, names=names)
    return {n: (v + 0.05 * rng.standard_normal(v.shape)).astype(dtype) for n, v in params.items()}


def _rms_np(x, w, dy):
    y, s = LL.rms_norm_forward(x, w, EPS)
    return y, list(LL.rms_norm_backward(s, w, dy))


def _rope_np(x_t, dy_t):
    return LL.rope_forward_t(x_t, B, D, THETA), [LL.rope_backward_t(dy_t, B, D, THETA)]


def _swiglu_np(g, u, dy):
    return LL.swiglu_forward(g, u), list(LL.swiglu_backward(g, u, dy))


def _gqa_np(kv_t, dy_t):
    return LL.repeat_kv_t(kv_t, H // KV, D), [LL.reduce_kv_t(dy_t, H // KV, D)]


def _layer_inputs(rng, dt):
    params = _perturbed(build_llama(LAYER_CFG), rng, dt, LAYER.param_names)
    return [rng.standard_normal((B, T, C)).astype(dt), *params.values()]


def _layer_np(x, *rest):
    params, dy = dict(zip(LAYER.param_names, rest[:-1], strict=True)), rest[-1]
    y, saved = LAYER.forward(params, x)
    dx, grads = LAYER.backward(params, saved, dy)
    return y, [dx, *(grads[n] for n in LAYER.param_names)]


def _layer_torch(x, *weights):
    return _decoder_ref(x, dict(zip(LAYER.param_names, weights, strict=True)), "model.layers.0.", LAYER_CFG)


CASES: dict[str, tuple[Callable, Callable, Callable]] = {
    "rms_norm": (
        lambda r, dt: [
            0.3 * r.standard_normal((B, T, C)).astype(dt),
            1 + 0.1 * r.standard_normal(C).astype(dt),
        ],
        _rms_np,
        lambda x, w: _rms_ref(x, w, EPS),
    ),
    "rope": (lambda r, dt: [r.standard_normal((C, B * T)).astype(dt)], _rope_np, _rope_t_ref),
    "swiglu": (
        lambda r, dt: [
            3 * r.standard_normal((B, T, INNER)).astype(dt),
            r.standard_normal((B, T, INNER)).astype(dt),
        ],
        _swiglu_np,
        lambda g, u: F.silu(g) * u,
    ),
    "gqa_repeat": (
        lambda r, dt: [r.standard_normal((KV * D, B * T)).astype(dt)],
        _gqa_np,
        lambda kv: kv.reshape(KV, D, B * T).repeat_interleave(H // KV, dim=0).reshape(C, B * T),
    ),
    "decoder_layer": (_layer_inputs, _layer_np, _layer_torch),
}


@pytest.mark.parametrize("dtype,rtol,atol", TOLERANCES, ids=["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_torch_autograd(case: str, dtype, rtol: float, atol: float, rng) -> None:
    ref.assert_layer_matches_torch(*CASES[case], dtype, rtol, atol, rng)


@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_finite_differences(case: str, rng) -> None:
    make, np_fn, torch_fn = CASES[case]
    inputs = make(rng, np.float64)
    out_shape = torch_fn(*[torch.tensor(a) for a in inputs]).shape
    r = rng.standard_normal(out_shape)  # scalar objective sum(y * r) exercises every output
    _, grads = np_fn(*[a.copy() for a in inputs], r.copy())
    eps = 1e-6
    for k, g in enumerate(grads):
        x = inputs[k]
        # every entry of the small layers; 12 of each tensor of the decoder layer
        picks = (
            range(x.size) if case != "decoder_layer" else rng.choice(x.size, min(12, x.size), replace=False)
        )
        for flat in picks:
            i = np.unravel_index(flat, x.shape)
            old = x[i]
            x[i] = old + eps
            up = float(np.sum(np_fn(*[a.copy() for a in inputs], r)[0] * r))
            x[i] = old - eps
            down = float(np.sum(np_fn(*[a.copy() for a in inputs], r)[0] * r))
            x[i] = old
            assert_allclose(g[i], (up - down) / (2 * eps), rtol=1e-5, atol=1e-7, err_msg=f"input {k} {i}")


@pytest.mark.parametrize("kv", [H, H // 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_decoder_layer_matches_torch_for_every_grouping(kv: int, bias: bool, rng) -> None:
    cfg = LlamaConfig(**{**LAYER_CFG.__dict__, "num_kv_heads": kv, "attention_bias": bias, "mlp_bias": bias})
    model = build_llama(cfg)
    unit = model.units[1]
    params = _perturbed(model, rng, np.float64, unit.param_names)
    x, dy = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    y, saved = unit.forward(params, x.copy())
    dx, grads = unit.backward(params, saved, dy.copy())
    assert dx is not None
    ref_x, tp = (
        torch.tensor(x, requires_grad=True),
        {n: torch.tensor(v, requires_grad=True) for n, v in params.items()},
    )
    ref_y = _decoder_ref(ref_x, tp, "model.layers.0.", cfg)
    ref_y.backward(torch.tensor(dy))
    assert_allclose(y, ref_y.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert_allclose(dx, ref_x.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert set(grads) == set(params)
    for n in params:
        assert_allclose(grads[n], tp[n].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=n)


def test_fused_and_in_place_paths_equal_the_plain_ones(rng) -> None:
    x, res, bias, w = (rng.standard_normal(s) for s in ((B, T, C), (B, T, C), C, C))
    y, _ = LL.rms_norm_forward(x + bias + res, w, EPS)
    h = x.copy()
    x1, y1, _ = LL.add_rms_norm_forward(h, bias, res, w, EPS)
    assert x1 is h
    assert_allclose(x1, x + bias + res, rtol=1e-15)
    assert_allclose(y1, y, rtol=1e-13)
    _, y2, _ = LL.add_rms_norm_forward(x.copy(), None, res, w, EPS)
    assert_allclose(y2, LL.rms_norm_forward(x + res, w, EPS)[0], rtol=1e-13)
    out = x.copy()
    assert_allclose(LL.add_residual(out, res, bias), x + bias + res, rtol=1e-15)
    assert_allclose(LL.add_residual(x.copy(), res), x + res, rtol=1e-15)
    # rotary in place (how the layer uses it) equals out of place; backward undoes forward exactly
    q_t = rng.standard_normal((C, B * T))
    q2 = q_t.copy()
    assert LL.rope_forward_t(q2, B, D, THETA, out=q2) is q2
    assert_allclose(q2, LL.rope_forward_t(q_t, B, D, THETA), rtol=1e-15)
    assert_allclose(LL.rope_backward_t(q2, B, D, THETA), q_t, rtol=1e-12, atol=1e-14)
    # swiglu backward may overwrite its inputs
    g, u, dm = (rng.standard_normal((B, T, INNER)) for _ in range(3))
    ref = LL.swiglu_backward(g, u, dm)
    got = LL.swiglu_backward(g, u, dm, out=(g, u))
    assert got[0] is not None and np.shares_memory(got[0], g) and np.shares_memory(got[1], u)
    assert_allclose(got[0], ref[0], rtol=1e-15)
    assert_allclose(got[1], ref[1], rtol=1e-15)


def test_rope_tables_are_cached_read_only_and_hf_valued() -> None:
    cos, sin = LL.rope_tables(T, D, THETA, np.dtype(np.float64))
    assert LL.rope_tables(T, D, THETA, np.dtype(np.float64))[0] is cos
    assert LL.rope_tables(T, D, THETA, np.dtype(np.float32))[0].dtype == np.float32
    assert not cos.flags.writeable and not sin.flags.writeable
    assert cos.shape == (D // 2, T)
    inv_freq = THETA ** (-np.arange(0, D, 2) / D)
    assert_allclose(sin, np.sin(np.outer(inv_freq, np.arange(T))), rtol=1e-15)


def test_swiglu_is_finite_without_warnings_for_huge_gates() -> None:
    g = np.array([[-1e4, -100.0, 0.0, 100.0, 1e4]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exp overflow would warn
        y = LL.swiglu_forward(g, np.ones_like(g))
        dg, du = LL.swiglu_backward(g, np.ones_like(g), np.ones_like(g))
    assert_allclose(y, [[0, 0, 0, 100, 1e4]], atol=1e-30)
    assert_allclose(dg, [[0, 0, 0.5, 1, 1]], atol=1e-30)
    assert np.isfinite(du).all()


def test_rotary_and_gqa_take_any_strides(rng) -> None:
    """They only split axes (always a view), so column-major [*, N] arrays are written through, not copied."""
    q = rng.standard_normal((C, B * T))
    view = np.asfortranarray(q)
    assert LL.rope_forward_t(view, B, D, THETA, out=view) is view
    assert_allclose(view, LL.rope_forward_t(q, B, D, THETA), rtol=1e-15)
    out = np.asfortranarray(np.zeros((C, B * T)))
    LL.repeat_kv_t(q[: KV * D], H // KV, D, out=out)
    assert_allclose(out, LL.repeat_kv_t(q[: KV * D], H // KV, D), rtol=0)
    red = np.asfortranarray(np.zeros((KV * D, B * T)))
    LL.reduce_kv_t(q, H // KV, D, out=red)
    assert_allclose(red, LL.reduce_kv_t(q, H // KV, D), rtol=0)
    with pytest.raises(ValueError, match="rotary: x_t"):
        LL.rope_forward_t(rng.standard_normal((C, B * T + 1)), B, D, THETA)

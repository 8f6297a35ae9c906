"""The float32 numba kernels (numerics/_fused.py): the exponential within 2 ulp, the attention's softmax
and its gradient equal to PyTorch's attention in float64 whatever the score buffers held, the GELU (tanh
form closer to the exact function than numpy's passes; erf form within float32 rounding of the float64
formula, negative tail included), and non-finite inputs still surfacing as NaN."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy.special import ndtr

from weightstream.numerics import _fused
from weightstream.numerics import attention as A
from weightstream.numerics import layers as L

torch = pytest.importorskip("torch")


def _ulps(actual: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|actual - exact| in float32 ulps of the exact value."""
    return np.abs(actual.astype(np.float64) - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)


def test_exp_within_two_ulp_over_its_range() -> None:
    t = np.linspace(-86.0, 86.0, 2_000_003, dtype=np.float32)
    t = np.concatenate([t, np.float32(1e-3) * np.arange(-1000, 1001, dtype=np.float32)])  # around 0
    out = t.copy()
    _fused.exp_into(out)
    assert _ulps(out, np.exp(t.astype(np.float64))).max() <= 2.0


def test_exp_clamps_instead_of_going_subnormal_or_overflowing_and_keeps_nan() -> None:
    t = np.array([-87.0, -200.0, -1e30, 87.0, 89.0, 1e30, np.nan, np.inf, -np.inf], dtype=np.float32)
    out = t.copy()
    with np.errstate(invalid="ignore"):
        _fused.exp_into(out)
    low, high = np.float32(np.exp(-86.0)), np.float32(np.exp(86.0))
    assert_allclose(out[:3], low, rtol=3e-7)
    assert (out[:3] >= np.finfo(np.float32).tiny).all()  # normal, never subnormal
    assert_allclose(out[3:6], high, rtol=3e-7)
    assert np.isfinite(out[:6]).all()
    assert np.isnan(out[6:]).all()  # NaN and +-inf come out NaN: a clamp must not hide them


def _torch_attention(qkv: np.ndarray, dy: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    b, t, c3 = qkv.shape
    c = c3 // 3
    ref = torch.tensor(qkv.astype(np.float64), requires_grad=True)
    q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in ref.split(c, dim=-1))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = out.transpose(1, 2).reshape(b, t, c)
    out.backward(torch.tensor(dy.astype(np.float64)))
    assert ref.grad is not None
    return out.detach().numpy(), ref.grad.numpy()


@pytest.mark.parametrize("b,h", [(2, 4), (1, 2)], ids=["heads-in-pairs", "one-head-per-call"])
@pytest.mark.parametrize("poison", [np.inf, np.nan, -np.inf])
@pytest.mark.parametrize("t", [1, 5, 128, 129, 300])
def test_float32_attention_matches_torch_whatever_the_buffers_held(
    t: int, poison: float, b: int, h: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels run (float32) on score buffers handed out full of ``poison``: the entries the products
    skip are masked, and the kernels write them 0 without reading them. Heads go two per call, or one
    (b * h too small to share out: MKL's batch of one matrix)."""
    monkeypatch.setattr(A, "_uninitialized", lambda shape, dtype: np.full(shape, poison, dtype=dtype))
    assert A._head_group(h, b) == h // 2
    c = 64
    qkv = rng.standard_normal((b, t, 3 * c)).astype(np.float32)
    dy = rng.standard_normal((b, t, c)).astype(np.float32)
    y_ref, dqkv_ref = _torch_attention(qkv, dy, h)
    y, saved = A.attention_forward(qkv, h)
    assert y.dtype == np.float32
    assert_allclose(y, y_ref, rtol=1e-5, atol=2e-6)
    assert_allclose(A.attention_backward(saved, dy), dqkv_ref, rtol=1e-4, atol=1e-5)
    above = np.triu(np.ones((t, t), dtype=bool), k=1).T  # key-major: key after query
    assert (saved.p[:, :, above] == 0).all()
    assert_allclose(saved.p.sum(axis=2), 1.0, rtol=2e-6)  # over keys, for every query


def test_float32_attention_with_dropout_equals_the_float64_formulas(rng: np.random.Generator) -> None:
    b, t, c, h, rate = 2, 140, 32, 4, 0.25
    qkv = rng.standard_normal((b, t, 3 * c))
    dy = rng.standard_normal((b, t, c))
    keep = rng.random((b, h, t, t)) >= rate
    y64, s64 = A.attention_forward(qkv, h, keep=keep, rate=rate)  # the numpy passes
    y32, s32 = A.attention_forward(qkv.astype(np.float32), h, keep=keep, rate=rate)  # the kernels
    assert_allclose(y32, y64, rtol=1e-5, atol=2e-6)
    assert_allclose(
        A.attention_backward(s32, dy.astype(np.float32)), A.attention_backward(s64, dy), rtol=1e-4, atol=1e-5
    )


def test_a_nan_score_makes_its_query_nan_not_a_quiet_number(rng: np.random.Generator) -> None:
    b, t, c, h = 1, 20, 16, 2
    qkv = rng.standard_normal((b, t, 3 * c)).astype(np.float32)
    qkv[0, 7, 0] = np.nan  # query 7 of head 0
    with np.errstate(invalid="ignore"):
        y, saved = A.attention_forward(qkv, h)
    assert np.isnan(saved.p[0, 0, :8, 7]).all()  # every key query 7 sees
    assert np.isnan(y[0, 7, : c // h]).all()
    assert np.isfinite(np.delete(y[0, :, : c // h], 7, axis=0)).all()  # other queries untouched


def _gelu64(z: np.ndarray, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    if exact:  # z Phi(z), Phi' = phi
        cdf = ndtr(z)
        return z * cdf, cdf + z * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    k, c = np.sqrt(2 / np.pi), 0.044715
    th = np.tanh(k * (z + c * z**3))
    return 0.5 * z * (1 + th), 0.5 * (1 + th) + 0.5 * z * (1 - th**2) * k * (1 + 3 * c * z**2)


@pytest.mark.parametrize("exact", [False, True], ids=["tanh", "erf"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_float32_gelu_matches_the_formula_in_float64(
    with_bias: bool, exact: bool, rng: np.random.Generator
) -> None:
    x = (rng.standard_normal((300, 1000)) * 3).astype(np.float32)
    x[0, :6] = [0.0, -1e4, 1e4, -50.0, 50.0, 1e-30]
    bias = rng.standard_normal(1000).astype(np.float32) if with_bias else None
    z = x.astype(np.float64) + (0.0 if bias is None else bias)
    y_ref, d_ref = _gelu64(z.astype(np.float32).astype(np.float64), exact)
    buf = x.copy()
    y, d = L.gelu_forward(buf, bias, out=buf, exact=exact)
    assert np.shares_memory(y, buf) and y.dtype == d.dtype == np.float32
    assert_allclose(y, y_ref, rtol=2e-6, atol=1e-7)
    assert_allclose(d, d_ref, rtol=5e-6, atol=1e-6)


def test_float32_gelu_keeps_its_relative_precision_for_negative_inputs() -> None:
    """0.5 (1 + tanh u) loses its digits where tanh u is near -1 (numpy's form: ~1e-4 relative error
    here); the kernel's 1 / (1 + e^(-2u)) does not."""
    x = np.linspace(-9.0, -2.0, 4096, dtype=np.float32).reshape(4, 1024)
    y, _ = L.gelu_forward(x)
    z = x.astype(np.float64)
    y_ref = z / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))  # the same h, all digits
    assert (np.abs(y - y_ref) / np.abs(y_ref)).max() < 1e-5


def test_float32_erf_gelu_keeps_its_relative_precision_for_negative_inputs() -> None:
    """Phi(z) for z < 0 is 0.5 erfc(-z / sqrt 2) straight from the erfc fit, not 1 - 0.5 erfc(...), which
    would cancel down to float32's absolute precision (~1e-8, against Phi(-9) ~ 1e-19)."""
    x = np.linspace(-9.0, -2.0, 4096, dtype=np.float32).reshape(4, 1024)
    y, _ = L.gelu_forward(x, exact=True)
    y_ref = x.astype(np.float64) * ndtr(x.astype(np.float64))
    assert (np.abs(y - y_ref) / np.abs(y_ref)).max() < 1e-5


@pytest.mark.parametrize("exact", [False, True], ids=["tanh", "erf"])
def test_float32_gelu_of_nan_and_inf(exact: bool, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 64)).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    with np.errstate(invalid="ignore"):
        y, d = L.gelu_forward(x, exact=exact)
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf  # as torch
    assert not np.isfinite(y[0, 2])  # torch: NaN; non-finite either way (tanh form: -inf)
    assert np.isnan(d[0, 0])
    assert np.isfinite(y[1]).all() and np.isfinite(d[1]).all()


def test_float32_runs_the_kernels_and_float64_the_numpy_passes(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the speed rests on: float32 attention and GELU go through the numba kernels."""
    calls: list[str] = []
    kernels = {"softmax_keys", "softmax_keys_grad", "gelu_tanh_rows", "gelu_erf_rows", "multiply_sum_columns"}
    for name in kernels:
        real = getattr(_fused, name)

        def counted(*a: Any, _n: str = name, _r: Any = real) -> Any:
            calls.append(_n)
            return _r(*a)

        monkeypatch.setattr(_fused, name, counted)
    for dtype in (np.float64, np.float32):
        calls.clear()
        qkv = rng.standard_normal((2, 20, 48)).astype(dtype)
        _, saved = A.attention_forward(qkv, 4)
        A.attention_backward(saved, rng.standard_normal((2, 20, 16)).astype(dtype))
        _, d = L.gelu_forward(rng.standard_normal((20, 16)).astype(dtype))
        L.gelu_forward(rng.standard_normal((20, 16)).astype(dtype), exact=True)
        L.gelu_backward_sum(d, np.ones_like(d))
        assert set(calls) == (kernels if dtype == np.float32 else set()), dtype


@pytest.mark.parametrize("f", [1000, 100])  # two column halves, or one part
def test_gelu_backward_with_the_bias_sum_in_the_same_pass(f: int, rng: np.random.Generator) -> None:
    """float32: dx = dy * dy/dx and its column sums from one kernel pass, bitwise what gelu_backward and
    sum_rows give apart; float64 takes those two."""
    from weightstream.numerics._blocked import sum_rows

    for dtype in (np.float32, np.float64):
        dydx, dy = (rng.standard_normal((700, f)).astype(dtype) for _ in range(2))
        apart = L.gelu_backward(None, dydx, dy)
        dx, sums = L.gelu_backward_sum(dydx, dy)
        np.testing.assert_array_equal(dx, apart)
        np.testing.assert_array_equal(sums, sum_rows(apart))
        assert_allclose(
            sums, (dy.astype(np.float64) * dydx.astype(np.float64)).sum(axis=0), rtol=1e-4, atol=1e-3
        )
        in_place = dy.copy()
        dx2, sums2 = L.gelu_backward_sum(dydx, in_place, out=in_place)
        assert np.shares_memory(dx2, in_place)
        np.testing.assert_array_equal(dx2, apart)
        np.testing.assert_array_equal(sums2, sums)

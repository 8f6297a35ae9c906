"""Each layer's forward and backward against PyTorch autograd and against central finite differences."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from weightstream.numerics import layers as L

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
from tests import torch_reference as ref  # noqa: E402

F = torch.nn.functional

# (dtype, rtol, atol): float64 at the layers' promised tolerance, float32 looser for rounding.
TOLERANCES = [(np.float64, 1e-5, 1e-6), (np.float32, 2e-4, 2e-5)]
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}

# Each case: name -> (make inputs(rng, dtype), numpy fwd+bwd(inputs, dy) -> (y, [grads]), torch fn(*inputs))
B, T, C, H, V = 2, 5, 8, 2, 11


def _linear_case(rng, dt):
    return [
        rng.standard_normal((B, T, C)).astype(dt),
        rng.standard_normal((C, 6)).astype(dt),
        rng.standard_normal(6).astype(dt),
    ]


def _linear_np(x, w, b, dy):
    y = L.linear_forward(x, w, b)
    dx, dw, db = L.linear_backward(x, w, dy)
    return y, [dx, dw, db]


def _ln_case(rng, dt):
    return [
        rng.standard_normal((B, T, C)).astype(dt) * 3 + 1,
        1 + 0.1 * rng.standard_normal(C).astype(dt),
        0.1 * rng.standard_normal(C).astype(dt),
    ]


def _ln_np(x, g, b, dy):
    y, s = L.layer_norm_forward(x, g, b, 1e-5)
    return y, list(L.layer_norm_backward(s, g, dy))


def _gelu_np(x, dy):
    y, th = L.gelu_forward(x)
    return y, [L.gelu_backward(x, th, dy)]


def _gelu_exact_np(x, dy):
    y, th = L.gelu_forward(x, exact=True)
    return y, [L.gelu_backward(x, th, dy)]


def _relu_np(x, dy):
    y = L.relu_forward(x)
    return y, [L.relu_backward(y, dy)]


def _attn_np(qkv, dy):
    y, s = L.attention_forward(qkv, H)
    return y, [L.attention_backward(s, dy)]


def _attn_torch(qkv):
    b, t, c3 = qkv.shape
    q, k, v = (z.view(b, t, H, c3 // 3 // H).transpose(1, 2) for z in qkv.split(c3 // 3, dim=-1))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c3 // 3)


IDS = np.array([[1, 3, 3, 0, 7], [7, 7, 2, 1, 3]])


def _embed_np(table, dy):
    return table[IDS], [L.embedding_backward(IDS, dy, table.shape[0])]


CASES: dict[str, tuple[Callable, Callable, Callable]] = {
    "linear": (_linear_case, _linear_np, lambda x, w, b: x @ w + b),
    "layer_norm": (_ln_case, _ln_np, lambda x, g, b: F.layer_norm(x, (C,), g, b, 1e-5)),
    "gelu": (
        lambda r, dt: [r.standard_normal((B, T, C)).astype(dt) * 2],
        _gelu_np,
        lambda x: F.gelu(x, approximate="tanh"),
    ),
    "gelu_exact": (  # ModelZoo's and torch's gelu (erf), not GPT-2's tanh form
        lambda r, dt: [r.standard_normal((B, T, C)).astype(dt) * 2],
        _gelu_exact_np,
        lambda x: F.gelu(x, approximate="none"),
    ),
    "relu": (lambda r, dt: [r.standard_normal((B, T, C)).astype(dt)], _relu_np, F.relu),
    "attention": (lambda r, dt: [r.standard_normal((B, T, 3 * C)).astype(dt)], _attn_np, _attn_torch),
    "embedding": (
        lambda r, dt: [r.standard_normal((V, C)).astype(dt)],
        _embed_np,
        lambda table: table[torch.as_tensor(IDS)],
    ),
}


@pytest.mark.parametrize("dtype,rtol,atol", TOLERANCES, ids=["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_torch_autograd(case: str, dtype, rtol: float, atol: float, rng) -> None:
    ref.assert_layer_matches_torch(*CASES[case], dtype, rtol, atol, rng)


def _finite_difference(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("case", [c for c in CASES if c != "relu"])  # relu's kink makes FD meaningless at 0
def test_layer_matches_finite_differences(case: str, rng) -> None:
    make, np_fn, torch_fn = CASES[case]
    inputs = make(rng, np.float64)
    out_shape = torch_fn(*[torch.tensor(a) for a in inputs]).shape
    r = rng.standard_normal(out_shape)  # scalar objective sum(y * r) exercises every output
    _, grads = np_fn(*[a.copy() for a in inputs], r.copy())
    for k, g in enumerate(grads):
        fd = _finite_difference(
            lambda: float(np.sum(np_fn(*[a.copy() for a in inputs], r)[0] * r)), inputs[k]
        )
        assert_allclose(g, fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,rtol,atol", TOLERANCES, ids=["float64", "float32"])
def test_cross_entropy_matches_torch(dtype, rtol: float, atol: float, rng) -> None:
    logits = (rng.standard_normal((B, T, V)) * 3).astype(dtype)
    targets = rng.integers(0, V, (B, T))
    ref = torch.tensor(logits.copy(), requires_grad=True)
    ref_loss = F.cross_entropy(ref.reshape(-1, V), torch.as_tensor(targets).reshape(-1))
    ref_loss.backward()
    loss, saved = L.cross_entropy_forward(logits, targets, denom=targets.size)
    dlogits = L.cross_entropy_backward(saved, logits.shape)
    assert_allclose(loss, ref_loss.item(), rtol=rtol)
    assert_allclose(dlogits, ref.grad.numpy(), rtol=rtol, atol=atol)
    if dtype == np.float64:
        fd = _finite_difference(lambda: L.cross_entropy_forward(logits, targets, targets.size)[0], logits)
        assert_allclose(dlogits, fd, rtol=1e-5, atol=1e-6)


def test_cross_entropy_denominator_splits_exactly(rng) -> None:
    """Shards' losses and gradients with the global denominator add up to the global ones."""
    logits = rng.standard_normal((4, 3, V))
    targets = rng.integers(0, V, (4, 3))
    loss, saved = L.cross_entropy_forward(logits, targets, targets.size)
    grad = L.cross_entropy_backward(saved, logits.shape)
    parts = [L.cross_entropy_forward(logits[i : i + 2], targets[i : i + 2], targets.size) for i in (0, 2)]
    assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-12)
    shard_grads = [L.cross_entropy_backward(p[1], (2, 3, V)) for p in parts]
    assert_allclose(np.concatenate(shard_grads), grad, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_in_place_is_the_same_bits_over_the_logits(dtype, rng) -> None:
    """``in_place`` writes the probabilities, then the gradient, over the logits (no buffer of its own)
    and changes no bit of the loss or the gradient, padding (-1) targets included."""
    logits = (rng.standard_normal((B, T, V)) * 3).astype(dtype)
    targets = rng.integers(0, V, (B, T))
    targets[0, :2] = -1
    loss, saved = L.cross_entropy_forward(logits.copy(), targets, denom=7.0)
    grad = L.cross_entropy_backward(saved, logits.shape)
    overwritten = logits.copy()
    loss_in_place, saved = L.cross_entropy_forward(overwritten, targets, denom=7.0, in_place=True)
    grad_in_place = L.cross_entropy_backward(saved, logits.shape)
    assert loss_in_place == loss
    assert_array_equal(grad_in_place, grad)
    assert np.shares_memory(grad_in_place, overwritten)


def test_attention_is_causal(rng) -> None:
    """Changing a later token never changes an earlier output."""
    qkv = rng.standard_normal((1, 6, 3 * C))
    y, _ = L.attention_forward(qkv.copy(), H)
    qkv[:, 4:] += 10.0
    y2, _ = L.attention_forward(qkv, H)
    assert_allclose(y2[:, :4], y[:, :4], rtol=1e-12)
    assert not np.allclose(y2[:, 4:], y[:, 4:])

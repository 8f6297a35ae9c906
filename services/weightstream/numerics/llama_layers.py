"""LLaMA's layers beside ``layers.py``'s: RMSNorm, rotary position embedding, SwiGLU, grouped-query K/V.

Same conventions as ``layers.py``: pure numpy, arrays keep their dtype, elementwise chains run over
cache-sized row blocks on our threads (``_blocked.for_row_blocks``), and ``out`` arguments let the decoder
layer write over a buffer it no longer needs. The attention core itself is ``attention.py``'s; these
helpers put q, k and v into the feature-major [3C, N] layout it takes (N = B * T, column b * T + t).

Conventions are Hugging Face's ``LlamaForCausalLM``:

- RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight (HF computes it in float32 whatever the input; here
  it runs in the input dtype).
- Rotary: within each head of D features, feature i pairs with i + D/2 ("rotate_half"), rotated by the
  angle t * theta^(-2i/D) at position t = 0..T-1 of each sequence; with RoPE scaling (linear, llama3)
  theta^(-2i/D) is replaced by ``rope_scaling.rope_inv_freq``'s scaled frequencies.
- Grouped-query attention: attention head h reads key/value head h // (H / KV) (``repeat_kv``).

Notation: N tokens, C hidden, H heads, KV key/value heads, D = C // H, F the MLP's inner size.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np

from weightstream.numerics._blocked import for_row_blocks, rows2, run_tasks
from weightstream.numerics.rope_scaling import RopeScaling, rope_inv_freq

__all__ = [
    "RMSNormSaved",
    "add_residual",
    "add_rms_norm_forward",
    "reduce_kv_t",
    "repeat_kv_t",
    "rms_norm_backward",
    "rms_norm_forward",
    "rope_backward_t",
    "rope_forward_t",
    "rope_tables",
    "swiglu_backward",
    "swiglu_forward",
]


def add_residual(y: np.ndarray, residual: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y += (bias +) residual, in place, in one pass over y (a projection's output before its residual)."""
    y2, r2 = rows2(y), rows2(residual)

    def rows(s: slice) -> None:
        if bias is not None:
            y2[s] += bias
        y2[s] += r2[s]

    for_row_blocks(rows, y2.shape[0], y2.shape[1])
    return y


# ---------------------------------------------------------------------------------------------------------
# RMSNorm over the last axis
# ---------------------------------------------------------------------------------------------------------
class RMSNormSaved(NamedTuple):
    xhat: np.ndarray  # [..., C] x * rstd
    rstd: np.ndarray  # [..., 1] 1 / sqrt(mean(x^2) + eps)


def _rms_norm(
    x2: np.ndarray,
    weight: np.ndarray,
    eps: float,
    add: tuple[np.ndarray | None, np.ndarray] | None,
) -> tuple[np.ndarray, RMSNormSaved]:
    """RMSNorm of x2 [N, C] -> (y, saved). With ``add=(bias or None, residual)`` first x2 += bias + residual
    in place, in the same pass (x2 is then the residual stream the caller keeps)."""
    n, c = x2.shape
    xhat, y = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty((n, 1), dtype=x2.dtype)
    inv_c = x2.dtype.type(1.0 / c)

    def rows(s: slice) -> None:
        xs = x2[s]
        if add is not None:
            if add[0] is not None:
                xs += add[0]
            xs += add[1][s]
        ms = np.einsum("nc,nc->n", xs, xs)[:, None]  # row sums of squares, no [n, C] temporary
        ms *= inv_c
        ms += eps
        r = np.divide(1.0, np.sqrt(ms, out=ms), out=rstd[s])
        xh = np.multiply(xs, r, out=xhat[s])
        np.multiply(xh, weight, out=y[s])

    for_row_blocks(rows, n, c)
    return y, RMSNormSaved(xhat, rstd)


def rms_norm_forward(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, RMSNormSaved]:
    """x [..., C] -> (y [..., C], saved)."""
    y, saved = _rms_norm(rows2(x), weight, eps, None)
    return y.reshape(x.shape), saved


def add_rms_norm_forward(
    h: np.ndarray, bias: np.ndarray | None, residual: np.ndarray, weight: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, RMSNormSaved]:
    """x = h (+ bias) + residual (in place in h), then RMSNorm(x), in one pass. Returns (x, y, saved)."""
    y, saved = _rms_norm(rows2(h), weight, eps, (bias, rows2(residual)))
    return h, y.reshape(h.shape), saved


def rms_norm_backward(
    saved: RMSNormSaved,
    weight: np.ndarray,
    dy: np.ndarray,
    residual: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns dx [..., C] (+ ``residual``, the gradient arriving around the norm) and dweight [C].

    dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * weight. ``out`` may be ``dy`` itself."""
    c = dy.shape[-1]
    xhat, rstd = saved
    dy2 = rows2(dy)
    dx = np.empty_like(dy2) if out is None else rows2(out)
    res = None if residual is None else rows2(residual)
    inv_c = dy.dtype.type(1.0 / c)
    # The column sum first (out may be dy), in two halves of the columns fixed by the shape (as
    # layer_norm_backward), so the thread count changes no bit.
    dweight = np.empty(c, dtype=dy.dtype)

    def columns(s: slice) -> None:
        np.einsum("nc,nc->c", dy2[:, s], xhat[:, s], out=dweight[s])

    run_tasks([partial(columns, s) for s in (slice(0, c // 2), slice(c // 2, c))])

    def rows(s: slice) -> None:
        g = np.multiply(dy2[s], weight, out=dx[s])
        m = np.einsum("nc,nc->n", g, xhat[s])[:, None]
        m *= inv_c
        g -= xhat[s] * m
        g *= rstd[s]
        if res is not None:
            g += res[s]

    for_row_blocks(rows, dy2.shape[0], c)
    return dx.reshape(dy.shape), dweight


# ---------------------------------------------------------------------------------------------------------
# Rotary position embedding, feature-major
# ---------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=16)
def rope_tables(
    t: int, head_dim: int, theta: float, dtype: np.dtype, scaling: RopeScaling | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each [D/2, T] and read-only: angle[i, t] = t * inv_freq[i], inv_freq = theta^(-2i/D)
    unless ``scaling`` scales it (``rope_scaling.rope_inv_freq``).

    HF's cos/sin are [T, D] with the half repeated (cat(freqs, freqs)); one half is all rotate_half needs.
    Computed in float64 and rounded once to ``dtype`` (HF multiplies in float32, so at position 2048 its
    angles are off by up to ~1e-4 rad; ours are correctly rounded)."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)  # [D/2]
    angle = inv_freq[:, None] * np.arange(t, dtype=np.float64)[None, :]  # [D/2, T]
    cos, sin = np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def _rotate_t(
    x_t: np.ndarray,
    batch: int,
    head_dim: int,
    theta: float,
    sign: float,
    out: np.ndarray | None,
    scaling: RopeScaling | None,
) -> np.ndarray:
    """Rotate each (i, i + D/2) pair of every head by sign * angle. x_t [heads * D, N] -> same."""
    rows, n = x_t.shape
    t, half = n // batch, head_dim // 2
    if head_dim % 2 or rows % head_dim or n % batch:
        raise ValueError(f"rotary: x_t {x_t.shape} is not heads x head_dim {head_dim} by batch {batch} x T")
    y_t = np.empty_like(x_t) if out is None else out
    heads = rows // head_dim
    # [heads, halves, D/2, B, T]. Only splits axes, so always a view (whatever the strides): writes land.
    x5, y5 = x_t.reshape(heads, 2, half, batch, t), y_t.reshape(heads, 2, half, batch, t)
    cos, sin = rope_tables(t, head_dim, theta, np.dtype(x_t.dtype), scaling)
    c, s = cos[:, None, :], (sin if sign > 0 else -sin)[:, None, :]  # [D/2, 1, T]: broadcast over batch

    def run(hs: slice) -> None:
        for h in range(hs.start, hs.stop):
            x1, x2, y1, y2 = x5[h, 0], x5[h, 1], y5[h, 0], y5[h, 1]  # [D/2, B, T]
            x1s, x2s = x1 * s, x2 * s  # before y (which may be x) is written
            np.multiply(x1, c, out=y1)
            y1 -= x2s  # x1 cos - x2 sin
            np.multiply(x2, c, out=y2)
            y2 += x1s  # x2 cos + x1 sin

    for_row_blocks(run, heads, head_dim * n)
    return y_t


def rope_forward_t(
    x_t: np.ndarray,
    batch: int,
    head_dim: int,
    theta: float,
    out: np.ndarray | None = None,
    scaling: RopeScaling | None = None,
) -> np.ndarray:
    """q or k feature-major [heads * D, N] -> rotated, same shape (``out`` may be ``x_t``: in place)."""
    return _rotate_t(x_t, batch, head_dim, theta, 1.0, out, scaling)


def rope_backward_t(
    dy_t: np.ndarray,
    batch: int,
    head_dim: int,
    theta: float,
    out: np.ndarray | None = None,
    scaling: RopeScaling | None = None,
) -> np.ndarray:
    """The rotation is orthogonal, so its gradient is the rotation by the opposite angle."""
    return _rotate_t(dy_t, batch, head_dim, theta, -1.0, out, scaling)


# ---------------------------------------------------------------------------------------------------------
# Grouped-query attention: key/value heads shared by groups of query heads
# ---------------------------------------------------------------------------------------------------------
def _per_kv_rows(fn: Callable[[int, slice], None], kv_heads: int, head_dim: int, row_len: int) -> None:
    """Call fn(kv_head, feature rows within it) over row blocks of the [KV * D] feature rows: blocks of
    rows rather than whole heads, so even one key/value head (multi-query) spreads over the threads."""

    def rows(s: slice) -> None:
        for j in range(s.start // head_dim, (s.stop - 1) // head_dim + 1):
            lo, hi = max(s.start, j * head_dim) - j * head_dim, min(s.stop, (j + 1) * head_dim) - j * head_dim
            fn(j, slice(lo, hi))

    for_row_blocks(rows, kv_heads * head_dim, row_len)


def repeat_kv_t(kv_t: np.ndarray, n_rep: int, head_dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """kv_t [KV * D, N] -> [KV * n_rep * D, N]: head h of the result is head h // n_rep of kv_t (HF's
    ``repeat_kv``), so the attention kernel sees plain multi-head q, k, v."""
    rows, n = kv_t.shape
    kv = rows // head_dim
    y_t = np.empty((rows * n_rep, n), dtype=kv_t.dtype) if out is None else out
    src, dst = kv_t.reshape(kv, head_dim, n), y_t.reshape(kv, n_rep, head_dim, n)  # split axes: views

    def fn(j: int, d: slice) -> None:
        dst[j, :, d] = src[j, None, d]  # broadcast over the group

    _per_kv_rows(fn, kv, head_dim, n_rep * n)
    return y_t


def reduce_kv_t(d_t: np.ndarray, n_rep: int, head_dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """The gradient of ``repeat_kv_t``: d_t [KV * n_rep * D, N] -> [KV * D, N], each group summed (in
    the group's order, whatever the thread count)."""
    rows, n = d_t.shape
    kv = rows // (n_rep * head_dim)
    y_t = np.empty((kv * head_dim, n), dtype=d_t.dtype) if out is None else out
    src, dst = d_t.reshape(kv, n_rep, head_dim, n), y_t.reshape(kv, head_dim, n)  # split axes: views

    def fn(j: int, d: slice) -> None:
        np.add.reduce(src[j, :, d], axis=0, out=dst[j, d])

    _per_kv_rows(fn, kv, head_dim, n_rep * n)
    return y_t


# ---------------------------------------------------------------------------------------------------------
# SwiGLU: silu(gate) * up
# ---------------------------------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) as 0.5 + 0.5 tanh(x / 2): the same number, and no overflow warning for x << 0."""
    dt = x.dtype.type
    s: np.ndarray = x * dt(0.5)
    np.tanh(s, out=s)
    s *= dt(0.5)
    s += dt(0.5)
    return s


def swiglu_forward(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gate, up [..., F] (the two projections, biases included) -> silu(gate) * up [..., F].

    Backward needs gate and up (kept by the caller) and nothing else."""
    g2, u2 = rows2(gate), rows2(up)
    y = np.empty_like(g2) if out is None else rows2(out)

    def rows(s: slice) -> None:
        a = _sigmoid(g2[s])
        a *= g2[s]  # silu(gate)
        np.multiply(a, u2[s], out=y[s])

    for_row_blocks(rows, g2.shape[0], g2.shape[1])
    return y.reshape(gate.shape)


def swiglu_backward(
    gate: np.ndarray,
    up: np.ndarray,
    dy: np.ndarray,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (dgate, dup). With sg = sigmoid(gate): dup = dy * gate * sg and
    dgate = dy * up * (sg + gate * sg * (1 - sg)). ``out`` may be ``(gate, up)`` (their last use)."""
    g2, u2, dy2 = rows2(gate), rows2(up), rows2(dy)
    dg = np.empty_like(g2) if out is None else rows2(out[0])
    du = np.empty_like(u2) if out is None else rows2(out[1])
    one = g2.dtype.type(1.0)

    def rows(s: slice) -> None:
        sg = _sigmoid(g2[s])
        silu = sg * g2[s]  # gate is read for the last time here: dg may overwrite it
        d = np.subtract(one, sg, out=dg[s])
        d *= silu
        d += sg  # dsilu/dgate
        d *= u2[s]  # up is read for the last time here: du may overwrite it
        d *= dy2[s]
        np.multiply(dy2[s], silu, out=du[s])

    for_row_blocks(rows, g2.shape[0], g2.shape[1])
    return dg.reshape(gate.shape), du.reshape(up.shape)

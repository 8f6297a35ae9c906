"""The layers a CS-2 worker computes, one forward/backward pair each.

Pure numpy, no I/O. Every ``*_forward`` returns ``(y, saved)`` where ``saved`` is what the matching
``*_backward`` needs; every ``*_backward`` returns ``(dx, grads)`` (or just ``dx`` for layers without
parameters). Arrays keep the dtype they come in with (float32 on workers, float64 in gradient checks).

Products run through ``_blocked.matmul`` and elementwise chains through ``_blocked.for_row_blocks``
(cache-sized row blocks on every core); the ``bias``/``residual``/``out`` arguments let a caller fuse an
add into a pass that reads the array anyway, or reuse a buffer, instead of paying another trip to DRAM or
a fresh allocation (the kernel zeroes fresh pages on first touch: ~3 ms per 25 MB here).

Notation: B batch, T sequence, C hidden (``n_embd``), H heads, D = C // H, F filter size, V vocab.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import numpy as np

from weightstream.numerics._blocked import for_row_blocks, product_parts, rows2, run_tasks, sum_rows
from weightstream.numerics.attention import AttentionSaved, attention_backward, attention_forward
from weightstream.numerics.sparse import SparseWeight, matmul_any, weight_grad

Weight = np.ndarray | SparseWeight  # a linear layer's weight: dense, or its kept entries (sparse.py)

__all__ = [
    "AttentionSaved",
    "LayerNormSaved",
    "add_bias_residual",
    "add_layer_norm_forward",
    "attention_backward",
    "attention_forward",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "gelu_backward",
    "gelu_backward_sum",
    "gelu_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "linear_backward",
    "linear_forward",
    "relu_backward",
    "relu_forward",
]


# ---------------------------------------------------------------------------------------------------------
# Linear (Hugging Face Conv1D layout: weight is [in, out], so y = x @ W + b)
# ---------------------------------------------------------------------------------------------------------
def linear_forward(x: np.ndarray, w: Weight, b: np.ndarray | None) -> np.ndarray:
    """x [..., in] @ w [in, out] + b [out] -> [..., out]. The input itself is what backward needs.

    Pass ``b=None`` and add the bias in the next elementwise pass where there is one (GELU, residual).
    ``w`` may be a ``SparseWeight``: then only its kept entries are multiplied (``sparse``)."""
    y = matmul_any(rows2(x), w, bias=b)  # [N, out]
    return y.reshape(*x.shape[:-1], w.shape[1])


def linear_backward(
    x: np.ndarray,
    w: Weight,
    dy: np.ndarray,
    need_dx: bool = True,
    dx_out: np.ndarray | None = None,
    db: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Returns dx [..., in] (None if not needed), dw [in, out] (a sparse ``w``: its kept entries, [nnz]),
    db [out] (the given ``db`` when the pass that made dy summed it already).

    dw is computed first, so ``dx_out`` may be ``x`` itself (its last use): a layer that owns its saved
    input writes dx over it instead of faulting in a fresh buffer."""
    x2, dy2 = rows2(x), rows2(dy)  # [N, in], [N, out]
    dw = weight_grad(x2, dy2, w)  # [in, out]
    db = sum_rows(dy2) if db is None else db  # [out]
    if not need_dx:
        return None, dw, db
    dx = matmul_any(dy2, w.T, out=None if dx_out is None else rows2(dx_out))  # [N, in]
    return dx.reshape(*dy.shape[:-1], w.shape[0]), dw, db


def add_bias_residual(y: np.ndarray, b: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """y += b + residual, in place, in one pass over y (a projection's output before its residual)."""
    y2, r2 = rows2(y), rows2(residual)

    def rows(s: slice) -> None:
        y2[s] += b
        y2[s] += r2[s]

    for_row_blocks(rows, y2.shape[0], y2.shape[1])
    return y


# ---------------------------------------------------------------------------------------------------------
# LayerNorm over the last axis
# ---------------------------------------------------------------------------------------------------------
class LayerNormSaved(NamedTuple):
    xhat: np.ndarray  # [..., C] normalised input
    rstd: np.ndarray  # [..., 1] 1 / sqrt(var + eps)


def _layer_norm(
    x2: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    add: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm of x2 [N, C] -> (y, xhat, rstd). With ``add=(bias, residual)`` first x2 += bias + residual
    in place, in the same pass (x2 is then the residual stream the caller keeps)."""
    n, c = x2.shape
    xhat, y = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty((n, 1), dtype=x2.dtype)
    inv_c = x2.dtype.type(1.0 / c)

    def rows(s: slice) -> None:
        xs = x2[s]
        if add is not None:
            xs += add[0]
            xs += add[1][s]
        # Row sums with einsum: 3x faster than add.reduce over 768-long rows, and it releases the GIL
        # (a GEMV against ones would hold it); no [n, C] temporaries.
        mean = np.einsum("nc->n", xs)[:, None]
        mean *= inv_c
        xc = np.subtract(xs, mean, out=xhat[s])
        var = np.einsum("nc,nc->n", xc, xc)[:, None]  # biased, like torch
        var *= inv_c
        var += eps
        r = np.divide(1.0, np.sqrt(var, out=var), out=rstd[s])
        xc *= r  # xhat
        ys = np.multiply(xc, gamma, out=y[s])
        ys += beta

    for_row_blocks(rows, n, c)
    return y, xhat, rstd


def layer_norm_forward(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> tuple[np.ndarray, LayerNormSaved]:
    y, xhat, rstd = _layer_norm(rows2(x), gamma, beta, eps, None)
    return y.reshape(x.shape), LayerNormSaved(xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1))


def add_layer_norm_forward(
    h: np.ndarray, b: np.ndarray, residual: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray, LayerNormSaved]:
    """x = h + b + residual (in place in h), then LayerNorm(x): one pass for both. Returns (x, y, saved)."""
    y, xhat, rstd = _layer_norm(rows2(h), gamma, beta, eps, (b, rows2(residual)))
    saved = LayerNormSaved(xhat.reshape(h.shape), rstd.reshape(*h.shape[:-1], 1))
    return h, y.reshape(h.shape), saved


def layer_norm_backward(
    saved: LayerNormSaved,
    gamma: np.ndarray,
    dy: np.ndarray,
    residual: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns dx [..., C] (+ ``residual``, the gradient arriving around the norm), dgamma [C], dbeta [C].

    ``out`` may be ``dy`` itself: each row block reads its dy before writing it."""
    c = dy.shape[-1]
    xhat, rstd = saved.xhat.reshape(-1, c), saved.rstd.reshape(-1, 1)  # [N, C], [N, 1]
    dy2 = rows2(dy)
    dx = np.empty_like(dy2) if out is None else rows2(out)
    res = None if residual is None else rows2(residual)
    inv_c = dy.dtype.type(1.0 / c)
    # The column sums first (out may be dy), in two halves of the columns on two threads; the halves
    # depend on the shape only, so the thread count changes no bit.
    dgamma, dbeta = np.empty(c, dtype=dy.dtype), np.empty(c, dtype=dy.dtype)

    def columns(s: slice) -> None:
        np.einsum("nc,nc->c", dy2[:, s], xhat[:, s], out=dgamma[s])
        np.add.reduce(dy2[:, s], axis=0, out=dbeta[s])

    run_tasks([partial(columns, s) for s in (slice(0, c // 2), slice(c // 2, c))])

    def rows(s: slice) -> None:
        # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma
        dxhat = np.multiply(dy2[s], gamma, out=dx[s])
        m1 = np.einsum("nc->n", dxhat)[:, None]
        m1 *= inv_c
        m2 = np.einsum("nc,nc->n", dxhat, xhat[s])[:, None]
        m2 *= inv_c
        dxhat -= m1
        dxhat -= xhat[s] * m2
        dxhat *= rstd[s]
        if res is not None:
            dxhat += res[s]

    for_row_blocks(rows, dy2.shape[0], c)
    return dx.reshape(dy.shape), dgamma, dbeta


# ---------------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------------
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu_forward(
    x: np.ndarray, bias: np.ndarray | None = None, out: np.ndarray | None = None, exact: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """GPT-2's tanh-approximated GELU of x (+ bias): x h(x) with h = 0.5 (1 + tanh(k (x + c x^3)))
    (Hugging Face's ``gelu_new``); with ``exact``, the erf GELU x Phi(x), Phi = 0.5 (1 + erf(x / sqrt 2))
    (Hugging Face's and torch's ``gelu``, ModelZoo's ``nonlinearity: gelu``).

    Returns (y, dy/dx). The derivative costs forward ~7 passes over row blocks in L2, and saves backward
    all but one (``gelu_backward`` is dy * dy/dx) and the need to keep x: with ``out=x`` the activation
    is overwritten by y, so the layer keeps two activation-sized buffers, not three.
    """
    dt = x.dtype.type
    x2 = rows2(x)
    y = np.empty_like(x2) if out is None else rows2(out)
    dydx = np.empty_like(x2)
    if x2.dtype == np.float32 and x2.flags.c_contiguous and y.flags.c_contiguous:
        from weightstream.numerics._fused import gelu_erf_rows, gelu_tanh_rows  # numba: on first use

        kernel = gelu_erf_rows if exact else gelu_tanh_rows
        b = np.zeros(x2.shape[1], np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
        # one pass per row block instead of ~14 numpy ones (see _fused); float64 keeps the formulas below
        for_row_blocks(lambda s: kernel(x2[s], b, y[s], dydx[s]), x2.shape[0], x2.shape[1])
        return y.reshape(x.shape), dydx.reshape(x.shape)
    if exact:  # here, not at the top: scipy.special costs every process ~0.15 s to import
        from scipy.special import erf

    def rows(s: slice) -> None:
        xs = y[s]  # x (+ bias) lives in y's block until y overwrites it
        if bias is not None:
            np.add(x2[s], bias, out=xs)
        elif out is not x:
            np.copyto(xs, x2[s])
        if exact:  # dy/dx = Phi(x) + x phi(x), phi the standard normal density
            phi = np.multiply(xs, xs, out=dydx[s])
            phi *= dt(-0.5)
            np.exp(phi, out=phi)
            phi *= dt(1.0 / math.sqrt(2.0 * math.pi))
            phi *= xs
            cdf = xs * dt(1.0 / math.sqrt(2.0))
            erf(cdf, out=cdf)
            cdf *= dt(0.5)
            cdf += dt(0.5)
            phi += cdf
            xs *= cdf  # y
            return
        sq = xs * xs
        h = sq * dt(_GELU_C * _GELU_K)
        h += dt(_GELU_K)
        h *= xs  # k (x + c x^3)
        np.tanh(h, out=h)
        h *= dt(0.5)
        h += dt(0.5)  # h
        # dy/dx = h + x h' with h' = 0.5 (1 - tanh^2) k (1 + 3 c x^2) = 2 h (1 - h) (k + 3 c k x^2)
        sq *= dt(6.0 * _GELU_C * _GELU_K)
        sq += dt(2.0 * _GELU_K)
        sq *= xs
        d = np.subtract(dt(1.0), h, out=dydx[s])
        d *= h
        d *= sq
        d += h
        xs *= h  # y

    for_row_blocks(rows, x2.shape[0], x2.shape[1])
    return y.reshape(x.shape), dydx.reshape(x.shape)


def gelu_backward(
    x: np.ndarray | None, dydx: np.ndarray, dy: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """dx = dy * dy/dx, the derivative from ``gelu_forward`` (``x`` is not needed; kept for the layer
    signature). ``out`` may be ``dy``."""
    d2, dy2 = rows2(dydx), rows2(dy)
    dx = np.empty_like(dy2) if out is None else rows2(out)

    def rows(s: slice) -> None:
        np.multiply(dy2[s], d2[s], out=dx[s])

    for_row_blocks(rows, dy2.shape[0], dy2.shape[1])
    return dx.reshape(dy.shape)


def gelu_backward_sum(
    dydx: np.ndarray, dy: np.ndarray, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(dx, the column sums of dx [F]): ``gelu_backward`` and the bias gradient of the product before the
    GELU in one pass over dx instead of two (float32: a kernel per column part of ``sum_rows``, summing
    rows in numpy's order; otherwise ``gelu_backward`` then ``sum_rows``). ``out`` may be ``dy``."""
    d2, dy2 = rows2(dydx), rows2(dy)
    if not (d2.dtype == dy2.dtype == np.float32 and d2.flags.c_contiguous and dy2.flags.c_contiguous):
        dx = gelu_backward(None, dydx, dy, out=out)
        return dx, sum_rows(rows2(dx))
    from weightstream.numerics._fused import multiply_sum_columns

    dx = np.empty_like(dy2) if out is None else rows2(out)
    sums = np.empty(dy2.shape[1], dtype=dy2.dtype)
    # sum_rows's column parts (columns are summed independently, so any split gives the same bits)
    parts = product_parts(dy2.shape[1])
    run_tasks([partial(multiply_sum_columns, dy2, d2, dx, sums, s.start, s.stop) for s in parts])
    return dx.reshape(dy.shape), sums


def relu_forward(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.maximum(x, 0)
    return y


def relu_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Takes the forward *output* (y > 0 exactly where x > 0), so x need not be kept."""
    return dy * (y > 0)


# ---------------------------------------------------------------------------------------------------------
# Embedding lookup (forward is plain indexing: wte[ids])
# ---------------------------------------------------------------------------------------------------------
def embedding_backward(ids: np.ndarray, dy: np.ndarray, num_embeddings: int) -> np.ndarray:
    """ids [...] int, dy [..., C] -> dtable [num_embeddings, C]; repeated ids accumulate."""
    c = dy.shape[-1]
    dtable = np.zeros((num_embeddings, c), dtype=dy.dtype)
    np.add.at(dtable, ids.reshape(-1), dy.reshape(-1, c))
    return dtable


# ---------------------------------------------------------------------------------------------------------
# Softmax cross-entropy
# ---------------------------------------------------------------------------------------------------------
def cross_entropy_forward(
    logits: np.ndarray, targets: np.ndarray, denom: float, *, in_place: bool = False
) -> tuple[float, tuple[np.ndarray, np.ndarray, float]]:
    """logits [..., V], targets [...] int -> sum of token losses / denom.

    ``in_place``: the softmax probabilities (and then the gradient) are written over ``logits``, which
    the caller no longer needs, instead of into a buffer of their own: one vocabulary-sized array less
    (67 MB at V8192, B8, T256; 412 MB at GPT-2's V50257), and no fresh pages to fault in every step (an
    array that size is above the workers' malloc mmap threshold, backends/environment.py). The same bits.

    A negative target (-1: padding) is ignored: its loss is 0 and its gradient row is 0 (torch's
    ``ignore_index``). ``denom`` is the number of counted (non-negative) targets of the *global* batch,
    not of this worker's shard (or, with ModelZoo's ``loss_scaling: batch_size``, the global batch size
    / loss_weight): summing the workers' gradients then gives exactly the gradient of the global loss,
    whatever N is.
    """
    v = logits.shape[-1]
    z = logits.reshape(-1, v)  # [N, V]
    tgt = targets.reshape(-1)  # [N]
    ignored = tgt < 0  # [N]
    any_ignored = bool(ignored.any())
    # a valid index for every row (the picked logit of an ignored row is discarded below)
    pick = np.where(ignored, 0, tgt) if any_ignored else tgt  # [N]
    # softmax probabilities, reused as the gradient buffer in backward
    p = z if in_place and z.flags.c_contiguous else np.empty_like(z)  # [N, V]
    token_loss = np.empty(z.shape[0], dtype=np.float64)  # [N]

    def rows(s: slice) -> None:
        zmax = z[s].max(axis=-1, keepdims=True)
        picked = z[s][np.arange(zmax.shape[0]), pick[s]]  # a copy, read before p may overwrite z
        e = np.subtract(z[s], zmax, out=p[s])
        np.exp(e, out=e)
        sumexp = e.sum(axis=-1, keepdims=True)
        token_loss[s] = (np.log(sumexp) + zmax)[:, 0] - picked
        e *= 1.0 / sumexp

    for_row_blocks(rows, z.shape[0], v)
    if any_ignored:
        token_loss[ignored] = 0.0
    return float(token_loss.sum() / denom), (p, tgt, denom)


def cross_entropy_backward(saved: tuple[np.ndarray, np.ndarray, float], shape: tuple[int, ...]) -> np.ndarray:
    """Returns dlogits with the logits' shape: (softmax - onehot) / denom, and a zero row for every
    ignored (negative) target. Consumes ``saved``."""
    p, tgt, denom = saved
    ignored = tgt < 0  # [N]
    if ignored.any():
        kept = np.nonzero(~ignored)[0]  # [n] rows that count
        p[kept, tgt[kept]] -= 1.0
        p[ignored] = 0.0
    else:
        p[np.arange(tgt.shape[0]), tgt] -= 1.0
    scale = p.dtype.type(1.0 / denom)

    def rows(s: slice) -> None:
        p[s] *= scale

    for_row_blocks(rows, p.shape[0], p.shape[1])
    return p.reshape(shape)

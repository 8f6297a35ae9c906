"""The layers a CS-2 worker computes, one forward/backward pair each.

Pure numpy, no I/O. Every ``*_forward`` returns ``(y, saved)`` where ``saved`` is what the matching
``*_backward`` needs; every ``*_backward`` returns ``(dx, grads)`` (or just ``dx`` for layers without
parameters). Arrays keep the dtype they come in with (float32 on workers, float64 in gradient checks).

Notation: B batch, T sequence, C hidden (``n_embd``), H heads, D = C // H, F filter size, V vocab.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from weightstream.numerics._blocked import for_row_blocks

__all__ = [
    "AttentionSaved",
    "LayerNormSaved",
    "attention_backward",
    "attention_forward",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "gelu_backward",
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
def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x [..., in] @ w [in, out] + b [out] -> [..., out]. The input itself is what backward needs."""
    y = x @ w  # [..., out]
    if b is not None:
        y += b
    return y


def linear_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, need_dx: bool = True
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Returns dx [..., in] (None if not needed), dw [in, out], db [out]."""
    x2 = x.reshape(-1, x.shape[-1])  # [N, in]
    dy2 = dy.reshape(-1, dy.shape[-1])  # [N, out]
    dw = x2.T @ dy2  # [in, out]
    db = dy2.sum(axis=0)  # [out]
    dx = dy @ w.T if need_dx else None  # [..., in]
    return dx, dw, db


# ---------------------------------------------------------------------------------------------------------
# LayerNorm over the last axis
# ---------------------------------------------------------------------------------------------------------
class LayerNormSaved(NamedTuple):
    xhat: np.ndarray  # [..., C] normalised input
    rstd: np.ndarray  # [..., 1] 1 / sqrt(var + eps)


def layer_norm_forward(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
) -> tuple[np.ndarray, LayerNormSaved]:
    c = x.shape[-1]
    x2 = x.reshape(-1, c)  # [N, C]
    xhat, y = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x.dtype)

    def rows(s: slice) -> None:
        xc = np.subtract(x2[s], x2[s].mean(axis=-1, keepdims=True), out=xhat[s])
        var = np.mean(xc * xc, axis=-1, keepdims=True)  # biased, like torch
        np.divide(1.0, np.sqrt(var + eps), out=rstd[s])
        xc *= rstd[s]  # xhat
        np.multiply(xc, gamma, out=y[s])
        y[s] += beta

    for_row_blocks(rows, x2.shape[0], c)
    return y.reshape(x.shape), LayerNormSaved(xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1))


def layer_norm_backward(
    saved: LayerNormSaved, gamma: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns dx [..., C], dgamma [C], dbeta [C]."""
    c = dy.shape[-1]
    xhat, rstd = saved.xhat.reshape(-1, c), saved.rstd.reshape(-1, 1)  # [N, C], [N, 1]
    dy2 = dy.reshape(-1, c)
    dgamma = np.einsum("nc,nc->c", dy2, xhat)
    dbeta = dy2.sum(axis=0)
    dx = np.empty_like(dy2)

    def rows(s: slice) -> None:
        # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma
        dxhat = np.multiply(dy2[s], gamma, out=dx[s])
        m1 = dxhat.mean(axis=-1, keepdims=True)
        m2 = np.mean(dxhat * xhat[s], axis=-1, keepdims=True)
        dxhat -= m1
        dxhat -= xhat[s] * m2
        dxhat *= rstd[s]

    for_row_blocks(rows, dy2.shape[0], c)
    return dx.reshape(dy.shape), dgamma, dbeta


# ---------------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------------
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPT-2's tanh-approximated GELU: 0.5 x (1 + tanh(k (x + c x^3))).

    Returns (y, th) with th = tanh(k (x + c x^3)): keeping it costs one activation-sized buffer and saves
    backward the tanh, the most expensive elementwise op here."""
    dt = x.dtype.type
    x2 = x.reshape(-1, x.shape[-1])
    y, th = np.empty_like(x2), np.empty_like(x2)

    def rows(s: slice) -> None:
        t = np.multiply(x2[s], x2[s], out=th[s])
        t *= dt(_GELU_C * _GELU_K)
        t += dt(_GELU_K)
        t *= x2[s]
        np.tanh(t, out=t)
        np.add(t, dt(1.0), out=y[s])
        y[s] *= x2[s]
        y[s] *= dt(0.5)

    for_row_blocks(rows, x2.shape[0], x2.shape[1])
    return y.reshape(x.shape), th.reshape(x.shape)


def gelu_backward(x: np.ndarray, th: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) (k + 3 c k x^2), with th from the forward."""
    dt = x.dtype.type
    x2, th2, dy2 = (a.reshape(-1, x.shape[-1]) for a in (x, th, dy))
    dx = np.empty_like(x2)

    def rows(s: slice) -> None:
        inner = x2[s] * x2[s]
        inner *= dt(3.0 * _GELU_C * _GELU_K)
        inner += dt(_GELU_K)
        inner *= x2[s]  # x (k + 3ck x^2)
        d = np.multiply(th2[s], th2[s], out=dx[s])
        np.subtract(dt(1.0), d, out=d)
        d *= inner
        d += th2[s]
        d += dt(1.0)
        d *= dt(0.5)
        d *= dy2[s]

    for_row_blocks(rows, x2.shape[0], x2.shape[1])
    return dx.reshape(x.shape)


def relu_forward(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def relu_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Takes the forward *output* (y > 0 exactly where x > 0), so x need not be kept."""
    return dy * (y > 0)


# ---------------------------------------------------------------------------------------------------------
# Causal multi-head self-attention core (the projections around it are linear layers)
# ---------------------------------------------------------------------------------------------------------
class AttentionSaved(NamedTuple):
    q: np.ndarray  # [B, H, T, D]
    k: np.ndarray  # [B, H, T, D]
    v: np.ndarray  # [B, H, T, D]
    att: np.ndarray  # [B, H, T, T] softmax probabilities (zero above the diagonal)


def _causal_bias(t: int, dtype: np.dtype) -> np.ndarray:
    """[T, T]: 0 where a query may look, -inf where it would look ahead. Added, not indexed: a
    broadcast add is one pass over att, boolean indexing is several."""
    return np.triu(np.full((t, t), -np.inf, dtype=dtype), k=1)


def attention_forward(qkv: np.ndarray, n_head: int) -> tuple[np.ndarray, AttentionSaved]:
    """qkv [B, T, 3C] (c_attn output, q|k|v along the last axis) -> y [B, T, C] before c_proj."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    d = c // n_head
    # [B, T, 3C] -> [B, T, 3, H, D] -> [3, B, H, T, D]; one transpose copy for all three
    q, k, v = np.ascontiguousarray(qkv.reshape(b, t, 3, n_head, d).transpose(2, 0, 3, 1, 4))
    scale = qkv.dtype.type(1.0 / math.sqrt(d))
    att = (q * scale) @ k.transpose(0, 1, 3, 2)  # [B, H, T, T]; scaling q is T/D times cheaper than att
    att3 = att.reshape(b * n_head, t, t)  # one [T, T] score matrix per (batch, head)
    bias = _causal_bias(t, att.dtype)

    def softmax(s: slice) -> None:
        a = att3[s]
        a += bias
        a -= a.max(axis=-1, keepdims=True)
        np.exp(a, out=a)
        a *= 1.0 / a.sum(axis=-1, keepdims=True)  # one divide per row, then a multiply per element

    for_row_blocks(softmax, b * n_head, t * t)
    y = att @ v  # [B, H, T, D]
    y = y.transpose(0, 2, 1, 3).reshape(b, t, c)  # [B, T, C]
    return y, AttentionSaved(q, k, v, att)


def attention_backward(saved: AttentionSaved, dy: np.ndarray) -> np.ndarray:
    """dy [B, T, C] -> dqkv [B, T, 3C]."""
    q, k, v, att = saved
    b, h, t, d = q.shape
    dy4 = dy.reshape(b, t, h, d).transpose(0, 2, 1, 3)  # [B, H, T, D]
    dqkv = np.empty((b, t, 3, h, d), dtype=dy.dtype)
    dqkv_view = dqkv.transpose(2, 0, 3, 1, 4)  # [3, B, H, T, D] view into dqkv
    np.matmul(att.transpose(0, 1, 3, 2), dy4, out=dqkv_view[2])  # dv = att^T @ dy
    datt = dy4 @ v.transpose(0, 1, 3, 2)  # [B, H, T, T]
    datt3, att3 = datt.reshape(b * h, t, t), att.reshape(b * h, t, t)

    def softmax_backward(s: slice) -> None:
        # ds = att * (datt - sum(datt * att, -1)); masked entries have att == 0
        d = datt3[s]
        d -= np.einsum("nij,nij->ni", d, att3[s])[..., None]
        d *= att3[s]

    for_row_blocks(softmax_backward, b * h, t * t)
    scale = dy.dtype.type(1.0 / math.sqrt(d))
    np.matmul(datt, k * scale, out=dqkv_view[0])  # dq = ds @ k / sqrt(d)
    np.matmul(datt.transpose(0, 1, 3, 2), q * scale, out=dqkv_view[1])  # dk = ds^T @ q / sqrt(d)
    return dqkv.reshape(b, t, 3 * h * d)


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
    logits: np.ndarray, targets: np.ndarray, denom: float
) -> tuple[float, tuple[np.ndarray, np.ndarray, float]]:
    """logits [..., V], targets [...] int -> sum of token losses / denom.

    ``denom`` is the token count of the *global* batch, not of this worker's shard: summing the
    workers' gradients then gives exactly the gradient of the global mean loss, whatever N is.
    """
    v = logits.shape[-1]
    z = logits.reshape(-1, v)  # [N, V]
    tgt = targets.reshape(-1)  # [N]
    p = np.empty_like(z)  # softmax probabilities, reused as the gradient buffer in backward
    token_loss = np.empty(z.shape[0], dtype=np.float64)  # [N]

    def rows(s: slice) -> None:
        zmax = z[s].max(axis=-1, keepdims=True)
        e = np.subtract(z[s], zmax, out=p[s])
        np.exp(e, out=e)
        sumexp = e.sum(axis=-1, keepdims=True)
        token_loss[s] = (np.log(sumexp) + zmax)[:, 0] - z[s][np.arange(e.shape[0]), tgt[s]]
        e *= 1.0 / sumexp

    for_row_blocks(rows, z.shape[0], v)
    return float(token_loss.sum() / denom), (p, tgt, denom)


def cross_entropy_backward(saved: tuple[np.ndarray, np.ndarray, float], shape: tuple[int, ...]) -> np.ndarray:
    """Returns dlogits with the logits' shape: (softmax - onehot) / denom. Consumes ``saved``."""
    p, tgt, denom = saved
    p[np.arange(tgt.shape[0]), tgt] -= 1.0
    scale = p.dtype.type(1.0 / denom)

    def rows(s: slice) -> None:
        p[s] *= scale

    for_row_blocks(rows, p.shape[0], p.shape[1])
    return p.reshape(shape)

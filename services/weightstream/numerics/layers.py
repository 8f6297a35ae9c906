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
    mean = x.mean(axis=-1, keepdims=True)  # [..., 1]
    xc = x - mean  # [..., C]
    var = np.mean(xc * xc, axis=-1, keepdims=True)  # [..., 1], biased like torch
    rstd = 1.0 / np.sqrt(var + eps)
    xc *= rstd  # xc becomes xhat in place: saves one [..., C] temporary
    y = xc * gamma
    y += beta
    return y, LayerNormSaved(xc, rstd.astype(x.dtype, copy=False))


def layer_norm_backward(
    saved: LayerNormSaved, gamma: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns dx [..., C], dgamma [C], dbeta [C]."""
    xhat, rstd = saved
    c = xhat.shape[-1]
    dy2 = dy.reshape(-1, c)
    dgamma = np.einsum("nc,nc->c", dy2, xhat.reshape(-1, c))
    dbeta = dy2.sum(axis=0)
    dxhat = dy * gamma  # [..., C]
    # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    m1 = dxhat.mean(axis=-1, keepdims=True)
    m2 = np.mean(dxhat * xhat, axis=-1, keepdims=True)
    dxhat -= m1
    dxhat -= xhat * m2
    dxhat *= rstd
    return dxhat, dgamma, dbeta


# ---------------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------------
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu_forward(x: np.ndarray) -> np.ndarray:
    """GPT-2's tanh-approximated GELU: 0.5 x (1 + tanh(k (x + c x^3))). Backward needs only x."""
    dt = x.dtype.type
    t = x * x
    t *= dt(_GELU_C)
    t += dt(1.0)
    t *= x
    t *= dt(_GELU_K)
    np.tanh(t, out=t)
    t += dt(1.0)
    t *= x
    t *= dt(0.5)
    return t


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3c x^2), th = tanh(k (x + c x^3))."""
    dt = x.dtype.type
    x2 = x * x
    th = x2 * dt(_GELU_C)
    th += dt(1.0)
    th *= x
    th *= dt(_GELU_K)
    np.tanh(th, out=th)
    # inner' = k (1 + 3c x^2), reusing x2
    x2 *= dt(3.0 * _GELU_C)
    x2 += dt(1.0)
    x2 *= dt(_GELU_K)
    # sech^2 = 1 - th^2
    s = th * th
    np.subtract(dt(1.0), s, out=s)
    s *= x2
    s *= x
    s += th
    s += dt(1.0)
    s *= dt(0.5)
    s *= dy
    return s


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
    att = q @ k.transpose(0, 1, 3, 2)  # [B, H, T, T]
    att *= qkv.dtype.type(1.0 / math.sqrt(d))
    att += _causal_bias(t, att.dtype)
    att -= att.max(axis=-1, keepdims=True)
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
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
    # softmax backward: ds = att * (datt - sum(datt * att, -1)); masked entries have att == 0
    datt -= np.einsum("bhij,bhij->bhi", datt, att)[..., None]
    datt *= att
    datt *= dy.dtype.type(1.0 / math.sqrt(d))
    np.matmul(datt, k, out=dqkv_view[0])  # dq = ds @ k
    np.matmul(datt.transpose(0, 1, 3, 2), q, out=dqkv_view[1])  # dk = ds^T @ q
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
    zmax = z.max(axis=-1, keepdims=True)
    p = z - zmax
    np.exp(p, out=p)
    sumexp = p.sum(axis=-1, keepdims=True)
    logsumexp = np.log(sumexp) + zmax  # [N, 1]
    rows = np.arange(tgt.shape[0])
    loss = float(np.sum(logsumexp[:, 0] - z[rows, tgt], dtype=np.float64) / denom)
    p /= sumexp  # softmax probabilities, reused as the gradient buffer in backward
    return loss, (p, tgt, denom)


def cross_entropy_backward(saved: tuple[np.ndarray, np.ndarray, float], shape: tuple[int, ...]) -> np.ndarray:
    """Returns dlogits with the logits' shape: (softmax - onehot) / denom. Consumes ``saved``."""
    p, tgt, denom = saved
    p[np.arange(tgt.shape[0]), tgt] -= 1.0
    p *= p.dtype.type(1.0 / denom)
    return p.reshape(shape)

"""Causal multi-head self-attention core, a few heads at a time with their scores in cache.

The projections around it are linear layers. Why per head rather than batched [B, H, T, T] arrays:

- numpy's stacked matmul over all heads runs each small product on both BLAS threads, which sync on
  every one (~125 GFLOP/s here against ~350 for big products). Here each of our threads
  (``for_row_blocks``) takes whole heads and runs their products on one thread, as one strided batch
  per product block (``_gemm.bmm``: MKL's batch, ~25% faster than numpy's stacked matmul at these sizes).
- Per head, the scores stay in cache from the QK^T product through the softmax to the PV product (the
  softmax passes one [T, 256] slab at a time), instead of a trip to DRAM per elementwise op over all 25 MB.
- Heads go in groups per call (``_head_group``): numpy holds the GIL for each call's setup, and with one
  head per call the two threads queued on it. In float32 the softmax and its gradient are numba kernels
  (``_fused``: one loop nest per slab, masked entries neither computed nor read); float64 keeps the
  numpy passes below.

Layout. The ``*_t`` functions take and give activations feature-major: qkv_t [3C, N] and y_t [C, N]
(N = B * T, column b * T + t), which the block's products make and read at no extra cost since BLAS
takes either orientation. A head's q, k, v are then [D, T] blocks of 1 KiB rows instead of T rows of D
floats 9 KiB apart (measured 7% faster per head). ``attention_forward``/``attention_backward`` are the
token-major [B, T, 3C] -> [B, T, C] interface on top, through transposed views.

Scores are key-major, ``p[j, i]`` for key j and query i: the softmax reduces over keys, and numpy reduces
along the leading axis of a C-contiguous block (an elementwise max/add of whole rows) 2.5x faster than
along the last one. Forward saves the probabilities.

Causality: the products run in blocks of queries, each multiplying only the keys up to its last query,
so they skip the all-masked blocks, as torch's SDPA with ``is_causal`` does; the softmax passes run over
whole [T, 256] slabs with the skipped blocks set to -inf (so 0 after exp). Block sizes depend on T only,
and every reduction stays within one (head, query), so results are bitwise the same whatever the thread
count.

Dropout on the probabilities (Hugging Face GPT-2's ``attn_pdrop``): y = (p * keep / (1 - rate)) v, with a
bool ``keep`` [B, H, T, T] laid out like p (key-major) that the caller draws (``dropout.dropout_mask``).
Saved for backward: p undropped (the softmax gradient needs it where keep is 0) and the mask itself, 1 byte
per score against p's 4 (+5% of a GPT-2 block's saved activations at B8 T256 C768), rather than drawing it
again in backward (~6 ms a block there, ~2% of its forward+backward). The kept probabilities go through a
per-thread [G, T, T] buffer, filled in the softmax pass while the slab is in L2; the 1 / (1 - rate) is
applied to y and dv after their products ([D, T], T/D times fewer multiplies than [T, T]) and to dp through
dy's 1/sqrt(D). Without a mask none of that runs: the results are bitwise the same as without dropout.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from weightstream.numerics._blocked import for_row_blocks, single_threaded_blas
from weightstream.numerics._gemm import bmm

__all__ = [
    "AttentionSaved",
    "attention_backward",
    "attention_backward_t",
    "attention_forward",
    "attention_forward_t",
]

# Queries per product. Products are cut into blocks of this many queries (keys, for dk and dv), and each
# block multiplies only the keys up to its last query: at T=256 that skips a quarter of the flops (the
# all-masked [128:, :128] quadrant), measured ~12% less time than whole [T, T] products on one thread;
# blocks of 64 skip more but their smaller products run slower.
_PRODUCT_BLOCK = 128
# Heads per call (the largest divisor of H up to this that leaves _MIN_TASKS groups to share out): with
# MKL's batched products and the fused softmax, 12 heads per call ran the B8 T256 H12 attention 15% faster
# than 4 (forward+backward 20.5 against 24.3 ms), 2 heads 17% slower. Both depend on the shapes only.
_MAX_HEAD_GROUP = 12
_MIN_TASKS = 4  # groups per call of attention_*_t: work for up to four threads (a worker has two)
# Queries per elementwise pass (softmax, its gradient): a [T, 256] slab is 1 MiB at T=1024, in L2.
_SOFTMAX_BLOCK = 256


class AttentionSaved(NamedTuple):
    qkv_t: np.ndarray  # [3C, N] the input, feature-major
    p: np.ndarray  # [B, H, T, T] probabilities key-major (p[b, h, key, query]), 0 where key > query
    keep: np.ndarray | None = None  # [B, H, T, T] bool dropout mask like p, or None: no dropout
    rate: float = 0.0  # the dropout rate ``keep`` was drawn with


def _uninitialized(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """np.empty, named: the score buffers hold whatever the allocator hands out (even inf or NaN) until
    written, which is why the blocks the products skip are filled explicitly. Tests poison it."""
    return np.empty(shape, dtype=dtype)


def _blocks(t: int, size: int) -> list[tuple[int, int]]:
    """[(i0, i1)] covering range(t); a function of t only, so the arithmetic never depends on threads."""
    return [(i0, min(i0 + size, t)) for i0 in range(0, t, size)]


@lru_cache(maxsize=16)
def _diag_mask(n: int, dtype: np.dtype) -> np.ndarray:
    """[n, n] key-major: -inf where the key comes after the query (row > column), else 0. Added to the
    diagonal square of a query block only; the keys before the block are all visible."""
    m = np.tril(np.full((n, n), -np.inf, dtype=dtype), k=-1)
    m.flags.writeable = False
    return m


@lru_cache(maxsize=16)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    o = np.ones(n, dtype=dtype)
    o.flags.writeable = False
    return o


def _kernels(dt: np.dtype) -> ModuleType | None:
    """The numba softmax kernels (``_fused``) for float32, imported on first use (numba costs every
    process ~0.13 s to import); None for other dtypes, which take the numpy passes."""
    if dt != np.float32:
        return None
    from weightstream.numerics import _fused

    return _fused


def _head_group(n_head: int, batch: int) -> int:
    """Heads per call: the largest divisor of n_head up to _MAX_HEAD_GROUP that still leaves batch *
    n_head / heads >= _MIN_TASKS groups (1 when none does)."""
    fits = [g for g in range(1, _MAX_HEAD_GROUP + 1) if n_head % g == 0 and batch * n_head // g >= _MIN_TASKS]
    return max(fits, default=1)


def _heads(a: np.ndarray, row0: int, hg: int, d: int, cols: slice) -> np.ndarray:
    """[G, D, T] view of the G heads whose features start at row ``row0`` of a feature-major [*, N] array,
    tokens ``cols``. Always a view (splitting the feature axis never needs a copy): outputs land in ``a``."""
    v = a[row0 : row0 + hg * d, cols].reshape(hg, d, -1)
    if not np.may_share_memory(v, a):
        raise ValueError("head view would be a copy")  # cannot happen; guards the outputs written here
    return v


def _keep_scale(
    keep: np.ndarray | None, rate: float, shape: tuple[int, ...], dt: np.dtype[np.floating[Any]]
) -> np.floating[Any]:
    """1 / (1 - rate), after checking that ``keep`` fits the probabilities ``shape`` [B, H, T, T]."""
    if keep is None:
        return dt.type(1.0)
    if keep.shape != shape or keep.dtype != np.bool_:
        raise ValueError(
            f"attention dropout mask must be bool {list(shape)} (got {keep.dtype} {list(keep.shape)})"
        )
    if not 0.0 <= rate < 1.0:  # also refuses NaN
        raise ValueError(f"attention dropout rate must be in [0, 1) (got {rate!r})")
    return dt.type(1.0 / (1.0 - rate))


def attention_forward_t(
    qkv_t: np.ndarray,
    batch: int,
    n_head: int,
    out: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    rate: float = 0.0,
) -> tuple[np.ndarray, AttentionSaved]:
    """qkv_t [3C, N] (c_attn output with its bias, q|k|v along the first axis) -> y_t [C, N].

    ``keep`` [B, H, T, T] (bool, key-major like the probabilities; None: no dropout) drops probabilities
    where False and scales the rest by 1 / (1 - ``rate``) before they weight v."""
    c = qkv_t.shape[0] // 3
    t = qkv_t.shape[1] // batch
    d = c // n_head
    dt = qkv_t.dtype
    scale = dt.type(1.0 / math.sqrt(d))
    blocks, slabs = _blocks(t, _PRODUCT_BLOCK), _blocks(t, _SOFTMAX_BLOCK)
    y_t = np.empty((c, batch * t), dtype=dt) if out is None else out
    p = _uninitialized((batch, n_head, t, t), dt)
    ones = _ones(t, dt)
    hg = _head_group(n_head, batch)
    keep_scale = _keep_scale(keep, rate, p.shape, dt)
    fused = _kernels(dt)

    def run(s: slice) -> None:
        pd = None if keep is None else _uninitialized((hg, t, t), dt)  # [G, keys, queries] kept p
        for n in range(s.start, s.stop):
            bi, h0 = divmod(n * hg, n_head)
            cols, r0 = slice(bi * t, (bi + 1) * t), h0 * d
            # [G, D, T]; scaling q is T/D times cheaper than scaling the scores
            q_scaled = _heads(qkv_t, r0, hg, d, cols) * scale
            k_t, v_t = _heads(qkv_t, c + r0, hg, d, cols), _heads(qkv_t, 2 * c + r0, hg, d, cols)
            y_h = _heads(y_t, r0, hg, d, cols)
            ph = p[bi, h0 : h0 + hg]  # [G, keys, queries]
            kh = None if keep is None else keep[bi, h0 : h0 + hg]  # [G, keys, queries] bool
            for i0, i1 in blocks:
                bmm(k_t[:, :, :i1].transpose(0, 2, 1), q_scaled[:, :, i0:i1], ph[:, :i1, i0:i1])
                if fused is None:
                    ph[:, i1:, i0:i1] = -np.inf  # keys after the block: not computed, and masked
            for c0, c1 in slabs:
                sc = ph[:, :, c0:c1]
                if fused is not None:  # one kernel; it writes the masked entries 0 without reading them
                    fused.softmax_keys(ph, c0, c1)
                else:
                    sc[:, c0:c1] += _diag_mask(c1 - c0, dt)  # the rest of the mask is in already
                    sc -= sc.max(axis=1, keepdims=True)
                    np.exp(sc, out=sc)
                    sc /= np.matmul(ones, sc)[:, None, :]  # sums over keys as GEMVs: one pass each
                if pd is not None and kh is not None:  # dropout: the kept p, while the slab is in cache
                    np.multiply(sc, kh[:, :, c0:c1], out=pd[:, :, c0:c1])
            pw = ph if pd is None else pd  # what weights v
            for i0, i1 in blocks:
                bmm(v_t[:, :, :i1], pw[:, :i1, i0:i1], y_h[:, :, i0:i1])
            if pd is not None:
                y_h *= keep_scale

    with single_threaded_blas():
        for_row_blocks(run, batch * n_head // hg, t * t * hg)
    return y_t, AttentionSaved(qkv_t, p, keep, rate)


def attention_backward_t(
    saved: AttentionSaved, dy_t: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """dy_t [C, N] -> dqkv_t [3C, N] (into ``out`` if given; it may alias nothing that is read here).

    With g = p (dp - delta), delta_i = sum_j p_ij dp_ij, and the 1/sqrt(D) score scale folded into dy
    (so into dp, delta and g): dq = g @ k, dk = g^T @ q, dv = p^T @ dy. Each output block is written by
    one product. delta is summed from p and dp, not taken as dy_i . y_i (equal in exact arithmetic, a
    [D, T] product instead of a [T, T] one): only then do g's rows sum to 0 to rounding, which keeps the
    key bias's gradient (0 in exact arithmetic) at noise that Adam does not blow up.

    With dropout (saved.keep), p~ = p * keep / (1 - rate) weighs v: dp = (v^T dy) * keep / (1 - rate)
    (the scale folded into dy with 1/sqrt(D)), and dv = p~^T @ dy; the softmax gradient is as above, with
    the undropped p.
    """
    qkv_t, p, keep, rate = saved
    batch, n_head, t, _ = p.shape
    c = dy_t.shape[0]
    d = c // n_head
    dt = dy_t.dtype
    keep_scale = _keep_scale(keep, rate, p.shape, dt)
    scale = dt.type(1.0 / math.sqrt(d)) if keep is None else dt.type(1.0 / math.sqrt(d) / (1.0 - rate))
    blocks, slabs = _blocks(t, _PRODUCT_BLOCK), _blocks(t, _SOFTMAX_BLOCK)
    dqkv_t = np.empty((3 * c, batch * t), dtype=dt) if out is None else out
    hg = _head_group(n_head, batch)
    fused = _kernels(dt)

    def run(s: slice) -> None:
        g = _uninitialized((hg, t, t), dt)  # [G, keys, queries], like p
        pd = None if keep is None else _uninitialized((hg, t, t), dt)  # the kept p, for dv
        for n in range(s.start, s.stop):
            bi, h0 = divmod(n * hg, n_head)
            cols, r0 = slice(bi * t, (bi + 1) * t), h0 * d
            q_t, k_t, v_t = (_heads(qkv_t, i * c + r0, hg, d, cols) for i in range(3))  # [G, D, T]
            dq_t, dk_t, dv_t = (_heads(dqkv_t, i * c + r0, hg, d, cols) for i in range(3))
            dy_h = _heads(dy_t, r0, hg, d, cols)
            dy_scaled = dy_h * scale
            ph = p[bi, h0 : h0 + hg]
            kh = None if keep is None else keep[bi, h0 : h0 + hg]
            for i0, i1 in blocks:
                bmm(v_t[:, :, :i1].transpose(0, 2, 1), dy_scaled[:, :, i0:i1], g[:, :i1, i0:i1])
                if fused is None:
                    g[:, i1:, i0:i1] = 0  # not computed nor read, but the passes below must see numbers
            for c0, c1 in slabs:
                gs, ps = g[:, :, c0:c1], ph[:, :, c0:c1]
                if pd is not None and kh is not None:  # through dropout: dropped p pass no gradient
                    ks = kh[:, :, c0:c1]
                    with np.errstate(invalid="ignore"):  # skipped keys may hold inf: never read after
                        gs *= ks
                    np.multiply(ps, ks, out=pd[:, :, c0:c1])
                if fused is not None:
                    fused.softmax_keys_grad(g, ph, c0, c1)
                else:
                    gs -= np.einsum("gkq,gkq->gq", gs, ps)[:, None, :]  # delta
                    gs *= ps
            pw = ph if pd is None else pd  # what weighed v in forward
            for i0, i1 in blocks:
                bmm(k_t[:, :, :i1], g[:, :i1, i0:i1], dq_t[:, :, i0:i1])
                # keys i0:i1 see the queries from i0 on
                bmm(q_t[:, :, i0:], g[:, i0:i1, i0:].transpose(0, 2, 1), dk_t[:, :, i0:i1])
                bmm(dy_h[:, :, i0:], pw[:, i0:i1, i0:].transpose(0, 2, 1), dv_t[:, :, i0:i1])
            if pd is not None:
                dv_t *= keep_scale

    with single_threaded_blas():
        for_row_blocks(run, batch * n_head // hg, t * t * hg)
    return dqkv_t


def attention_forward(
    qkv: np.ndarray, n_head: int, keep: np.ndarray | None = None, rate: float = 0.0
) -> tuple[np.ndarray, AttentionSaved]:
    """qkv [B, T, 3C] (c_attn output with its bias, q|k|v along the last axis) -> y [B, T, C]; ``keep``
    and ``rate``: dropout on the probabilities as in ``attention_forward_t``."""
    b, t, c3 = qkv.shape
    y = np.empty((b, t, c3 // 3), dtype=qkv.dtype)
    y_t = y.reshape(b * t, -1).T
    _, saved = attention_forward_t(qkv.reshape(b * t, c3).T, b, n_head, out=y_t, keep=keep, rate=rate)
    return y, saved


def attention_backward(saved: AttentionSaved, dy: np.ndarray) -> np.ndarray:
    """dy [B, T, C] -> dqkv [B, T, 3C]."""
    b, t, c = dy.shape
    dqkv = np.empty((b, t, 3 * c), dtype=dy.dtype)
    attention_backward_t(saved, dy.reshape(b * t, c).T, out=dqkv.reshape(b * t, 3 * c).T)
    return dqkv

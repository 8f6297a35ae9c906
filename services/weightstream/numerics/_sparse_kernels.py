"""The numba kernels behind ``sparse.py``: a sparse-weight product (SpMM) and a sampled product (SDDMM).

Layout: both kernels run along the activations' row axis M. A tile of ``TILE`` rows of an activation
x [M, K] is transposed once into xt [K, TILE] (L2-resident: 768 x 256 floats = 768 KiB) so that every
kept weight entry becomes one SIMD multiply-add over TILE contiguous floats. Operands that arrive
transposed (x given as x.T [K, M], contiguous: the worker's ``a_t`` and ``dqkv_t``) are read in place,
and an output whose transpose is contiguous is written in place; only the other layouts pay for the
16 x 16 blocked transposes.

Determinism: an output element of ``spmm_tiles`` is one sequential sum over its kept entries in
structure order (four entries per step, left to right: ``(((acc + v0 x0) + v1 x1) + ...``), whatever
tiles or threads compute it: ``fastmath`` there is only ``contract`` (a multiply and add become one FMA,
fixed in the compiled kernel), no reassociation. ``sddmm_tiles`` sums each tile of TILE rows as one
vectorized dot product (see ``_dot``: the one place with ``reassoc``), then adds tiles in order;
callers split the tiles into parts fixed by the shape and add the parts in order.

Compilation: one signature per kernel (callers pass C-contiguous, read-only inputs of fixed dtypes), cached
on disk (``cache=True``: next to this file in ``__pycache__``, else the user's cache dir, or
``NUMBA_CACHE_DIR`` when set). Where no cache dir is writable the kernels compile in memory on each
process's first call instead of failing the import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = ["COL_BLOCK", "TILE", "sddmm_tiles", "spmm_tiles", "transpose_into"]

TILE = 256  # activation rows per tile (measured: 128 is 10-15% slower, 512 spills L2 for K = 3072)
COL_BLOCK = 512  # columns of b.T per pass: 512 x 256 floats = 512 KiB of L2
_T = 16  # side of the blocked transpose (measured: 8 and 32 are 30% slower on 256 x 3072)


def _jit(fn: Callable[..., Any]) -> Any:
    """``njit`` with the on-disk cache when some cache dir is writable, in-memory compilation otherwise."""
    options: dict[str, Any] = {"nogil": True, "boundscheck": False, "fastmath": {"contract"}}
    try:
        return njit(cache=True, **options)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available" (read-only install)
        return njit(cache=False, **options)(fn)


@_jit
def transpose_into(src: np.ndarray, i0: int, i1: int, dst: np.ndarray) -> None:
    """dst[:, :i1 - i0] = src[i0:i1, :].T in 16 x 16 blocks (both stay in L1 while a block moves)."""
    n = i1 - i0
    k = src.shape[1]
    for a0 in range(0, n, _T):
        for b0 in range(0, k, _T):
            if a0 + _T <= n and b0 + _T <= k:
                for b in range(_T):
                    for a in range(_T):
                        dst[b0 + b, a0 + a] = src[i0 + a0 + a, b0 + b]
            else:
                for a in range(a0, min(a0 + _T, n)):
                    for b in range(b0, min(b0 + _T, k)):
                        dst[b, a] = src[i0 + a, b]


@_jit
def _column(
    ptr: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    src: np.ndarray,
    off: int,
    w: int,
    acc: np.ndarray,
    o: int,
) -> None:
    """acc[:w] = sum(val[k] * src[idx[k], off:off + w] for k in ptr[o]:ptr[o + 1]), two entries per pass
    (half the loads and stores of acc), left to right."""
    for j in range(w):
        acc[j] = 0.0
    k = ptr[o]
    end = ptr[o + 1]
    while k + 3 < end:
        v0, r0, v1, r1 = val[k], idx[k], val[k + 1], idx[k + 1]
        v2, r2, v3, r3 = val[k + 2], idx[k + 2], val[k + 3], idx[k + 3]
        for j in range(w):
            acc[j] = (
                acc[j]
                + v0 * src[r0, off + j]
                + v1 * src[r1, off + j]
                + v2 * src[r2, off + j]
                + v3 * src[r3, off + j]
            )
        k += 4
    while k < end:
        v0, r0 = val[k], idx[k]
        for j in range(w):
            acc[j] = acc[j] + v0 * src[r0, off + j]
        k += 1


@_jit
def spmm_tiles(
    ptr: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    x: np.ndarray,
    x_t: bool,
    out: np.ndarray,
    out_t: bool,
    bias: np.ndarray,
    tile: int,
    t0: int,
    t1: int,
) -> None:
    """out[m, o] = sum(val[k] * x[m, idx[k]] for k in ptr[o]:ptr[o + 1]) (+ bias[o]) for the rows m of
    tiles [t0, t1) of ``tile`` rows (the tiling never changes a bit of out: see ``spmm_tile``).

    ptr int64 [n_out + 1], idx int32 [nnz], val float32 [nnz]: the kept entries per output o.
    x: [M, K], or x.T [K, M] when ``x_t``. out: [M, n_out], or out.T [n_out, M] when ``out_t``.
    bias: float32 [n_out], or [0] for none (added after the sum, as ``_blocked.matmul`` adds it).
    """
    n_out = ptr.shape[0] - 1
    m_all = x.shape[1] if x_t else x.shape[0]
    xt = np.empty((0 if x_t else x.shape[1], tile), np.float32)  # the tile transposed, when x is not already
    buf = np.empty((_T, tile), np.float32)  # out.T for 16 outputs, when out is not transposed
    acc = np.empty(tile, np.float32)
    for t in range(t0, t1):
        m0 = t * tile
        w = min(tile, m_all - m0)
        if not x_t:
            transpose_into(x, m0, m0 + w, xt)
        for o0 in range(0, n_out, _T):
            o1 = min(o0 + _T, n_out)
            for o in range(o0, o1):
                if x_t:
                    _column(ptr, idx, val, x, m0, w, acc, o)
                else:
                    _column(ptr, idx, val, xt, 0, w, acc, o)
                if bias.shape[0] > 0:
                    b = bias[o]
                    for j in range(w):
                        acc[j] = acc[j] + b
                if out_t:
                    for j in range(w):
                        out[o, m0 + j] = acc[j]
                else:
                    for j in range(w):
                        buf[o - o0, j] = acc[j]
            if not out_t:
                for j in range(w):
                    for o in range(o0, o1):
                        out[m0 + j, o] = buf[o - o0, j]


def _jit_reduction(fn: Callable[..., Any]) -> Any:
    """``_jit`` plus ``reassoc``: LLVM may split a sum into SIMD lanes (16 floats x 4 registers here)."""
    options: dict[str, Any] = {"nogil": True, "boundscheck": False, "fastmath": {"contract", "reassoc"}}
    try:
        return njit(cache=True, **options)(fn)
    except RuntimeError:
        return njit(cache=False, **options)(fn)


@_jit_reduction
def _dot(a: np.ndarray, r: int, aoff: int, b: np.ndarray, c: int, boff: int, w: int) -> np.float32:
    """sum(a[r, aoff:aoff + w] * b[c, boff:boff + w]).

    Why ``reassoc`` here (and only here): explicit lane accumulators in an array went through memory,
    one store-to-load round trip per 64 products, and ran the sampled product 2.5x slower (measured).
    The lane split LLVM picks is fixed in the compiled kernel, and w is fixed by the shape (TILE rows,
    the last tile's remainder), so the result is the same on every run, in every thread, on one machine;
    only another CPU (other SIMD width, hence another compiled kernel) may round it differently.
    """
    s = np.float32(0.0)
    for j in range(w):
        s += a[r, aoff + j] * b[c, boff + j]
    return s


@_jit
def sddmm_tiles(
    ptr: np.ndarray,
    idx: np.ndarray,
    a: np.ndarray,
    a_t: bool,
    b: np.ndarray,
    b_t: bool,
    out: np.ndarray,
    t0: int,
    t1: int,
) -> None:
    """out[k] = sum over the rows m of tiles [t0, t1) of a[m, r] * b[m, idx[k]], for k in ptr[r]:ptr[r + 1].

    ptr int64 [R + 1], idx int32 [nnz]: the kept entries of W [R, C] in row-major order.
    a: [M, R], or a.T [R, M] when ``a_t``; b: [M, C], or b.T [C, M] when ``b_t``. out: float32 [nnz].
    """
    n_rows = ptr.shape[0] - 1
    n_cols = b.shape[0] if b_t else b.shape[1]
    m_all = a.shape[1] if a_t else a.shape[0]
    at = np.empty((0 if a_t else a.shape[1], TILE), np.float32)
    bt = np.empty((0 if b_t else n_cols, TILE), np.float32)
    cursor = np.empty(n_rows, np.int64)  # row r's first entry not yet visited in this tile
    out[:] = 0.0
    for t in range(t0, t1):
        m0 = t * TILE
        w = min(TILE, m_all - m0)
        if not a_t:
            transpose_into(a, m0, m0 + w, at)
        if not b_t:
            transpose_into(b, m0, m0 + w, bt)
        cursor[:] = ptr[:-1]
        # Columns in blocks of COL_BLOCK so that b's rows in use stay in L2 while every row of a passes.
        for c1 in range(COL_BLOCK, n_cols + COL_BLOCK, COL_BLOCK):
            for r in range(n_rows):
                k = cursor[r]
                end = ptr[r + 1]
                while k < end and idx[k] < c1:
                    c = idx[k]
                    if a_t and b_t:
                        out[k] += _dot(a, r, m0, b, c, m0, w)
                    elif a_t:
                        out[k] += _dot(a, r, m0, bt, c, 0, w)
                    elif b_t:
                        out[k] += _dot(at, r, 0, b, c, m0, w)
                    else:
                        out[k] += _dot(at, r, 0, bt, c, 0, w)
                    k += 1
                cursor[r] = k

"""Unstructured weight sparsity on the worker: the weight object, its products, and the dense/sparse rule.

A weight W [R, C] (in its checkpoint layout) keeps a fixed set of entries (its mask); the worker holds
only their values and flat positions (``SparseWeight``) and computes y = x @ W, dx = dy @ W.T and the
masked gradient dW = (x.T @ dy)[mask] with the numba kernels of ``_sparse_kernels.py``, or, where the
rule says those lose, with ``_blocked.matmul`` on the densified weight.

The rule (``use_sparse_kernels``) looks at the weight's shape and density only, never at the activation
rows M or a run-time timing, so every worker and every rerun picks the same kernel and the results stay
bitwise reproducible. Tuned with bench/sparse_kernels.py (THREADS = 2, 2-core AVX-512 Xeon, M = 2048,
ms, min of 5; dW sparse is the sampled product, dense the full one):

    shape        density   dense fwd/dx/dW ms     sparse fwd/dx/dW ms   sparse/dense
     768 x 2304  0.50      21.1  20.5  21.4       39.7  54.0  48.7      2.26
     768 x 2304  0.25      19.6  19.3  19.9       21.5  28.9  26.4      1.30
     768 x 2304  0.10      19.7  19.2  21.7       10.9  13.2  12.1      0.60
     768 x 2304  0.05      19.5  19.7  20.0        6.8   7.5   7.2      0.36
     768 x 768   0.50       6.6   6.5   6.9       13.0  12.8  15.8      2.08
     768 x 768   0.25       6.4   6.5   6.9        7.1   6.9   8.7      1.14
     768 x 768   0.10       6.4   6.5   7.1        3.6   3.5   3.9      0.55
     768 x 768   0.05       7.2   6.7   7.7        2.4   2.2   2.2      0.31
     768 x 3072  0.50      26.2  28.2  28.8       51.2  72.2  64.2      2.25
     768 x 3072  0.25      25.2  25.8  26.9       27.5  38.5  36.3      1.31
     768 x 3072  0.10      25.8  27.1  27.2       13.0  17.3  16.1      0.58
     768 x 3072  0.05      26.2  28.4  27.0        8.4   9.7   9.2      0.34
    3072 x 768   0.50      26.7  28.3  28.5       72.4  51.1  63.9      2.24
    3072 x 768   0.25      26.4  26.8  28.2       38.5  28.2  34.4      1.24
    3072 x 768   0.10      26.5  25.6  30.3       17.8  13.6  15.5      0.57
    3072 x 768   0.05      29.1  27.8  27.4        9.7   8.6   8.9      0.32

Sparse time grows about linearly with density (ratio ~ 5.5 x density + 0.05): break-even near 0.18, so
the rule takes the sparse kernels at density <= 0.15 (~0.85 by that line, not measured: a margin for
other CPUs). Weights under 64 Ki entries stay dense (not measured; their products take microseconds).
At 90% sparsity the three products take 0.55-0.6x the dense time, at 95% 0.31-0.36x.

Threads: the kernels release the GIL and run as ``_blocked.run_tasks`` parts over fixed ranges of row
tiles, so the worker keeps one thread pool (numba's own pool is never started).
"""

from __future__ import annotations

from functools import cached_property, partial
from types import ModuleType

import numpy as np

from weightstream.numerics._blocked import matmul, run_tasks

__all__ = [
    "SparseWeight",
    "SparseWeightT",
    "matmul_any",
    "sampled_matmul",
    "sparse_matmul",
    "use_sparse_kernels",
    "weight_grad",
]

_PARTS = 2  # row-tile parts per product: fixed (not THREADS) so the sampled product's sums never change
_MAX_DENSITY = 0.15  # measured break-even ~0.18 on the d768 shapes (table above)
_MIN_ELEMS = 1 << 16  # smaller weights: products of microseconds, not worth a second code path


def _kernels() -> ModuleType:
    """The numba kernels, imported on first use: numba costs ~0.13 s to import, which every process of
    a dense job (and every CLI call) would otherwise pay."""
    from weightstream.numerics import _sparse_kernels

    return _sparse_kernels


def use_sparse_kernels(shape: tuple[int, int], density: float) -> bool:
    """THE RULE: True where the sparse kernels beat dense products for a weight of ``shape`` with
    ``density`` kept entries, from the shape and density only (see the table above)."""
    rows, cols = shape
    return rows * cols >= _MIN_ELEMS and density <= _MAX_DENSITY


class _Structure:
    """Everything derived from the positions of W [R, C]: shared by every ``with_values`` copy."""

    def __init__(self, shape: tuple[int, int], positions: np.ndarray) -> None:
        rows, cols = shape
        r, c = np.divmod(positions, cols)  # [nnz] each, int64
        self.indptr = np.zeros(rows + 1, np.int64)  # CSR: row r's entries are indptr[r]:indptr[r + 1]
        np.cumsum(np.bincount(r, minlength=rows), out=self.indptr[1:])
        self.indices = _ro(c.astype(np.int32))  # column of each entry, in positions order
        # CSC (W's columns = W.T's rows, what y = x @ W sums over): a stable sort keeps rows ascending.
        self.csc_order = np.argsort(c, kind="stable")  # [nnz]: CSC entry i is positions entry csc_order[i]
        self.csc_indptr = np.zeros(cols + 1, np.int64)
        np.cumsum(np.bincount(c, minlength=cols), out=self.csc_indptr[1:])
        self.csc_indices = _ro(r[self.csc_order].astype(np.int32))
        self.indptr, self.csc_indptr = _ro(self.indptr), _ro(self.csc_indptr)


class SparseWeight:
    """W [R, C] whose only possibly non-zero entries are at ``positions`` (flat row-major indices into
    [R, C], int64, strictly ascending); ``values`` float32 [nnz] in the same order (never written)."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(
        self, shape: tuple[int, int], positions: np.ndarray, values: np.ndarray, s: _Structure
    ) -> None:
        self.shape = shape
        self.positions = positions
        self.values = values
        self._s = s

    @classmethod
    def from_positions(
        cls, shape: tuple[int, int], positions: np.ndarray, values: np.ndarray
    ) -> SparseWeight:
        """Validate and derive the structure once (the worker caches it per mask, until the mask changes)."""
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"SparseWeight shape must be 2-D and non-empty (got {shape!r})")
        shape = (int(shape[0]), int(shape[1]))
        positions = np.asarray(positions)
        if positions.ndim != 1 or positions.dtype != np.int64:
            raise ValueError(
                f"SparseWeight positions must be int64 [nnz] (got {positions.dtype} {positions.shape})"
            )
        if positions.size and (positions[0] < 0 or positions[-1] >= shape[0] * shape[1]):
            raise ValueError(
                f"SparseWeight positions must lie in [0, {shape[0] * shape[1]}) for shape {shape}"
            )
        if positions.size > 1 and not bool(np.all(positions[1:] > positions[:-1])):
            raise ValueError("SparseWeight positions must be strictly ascending")
        return cls(shape, positions, _check_values(values, positions.size), _Structure(shape, positions))

    def with_values(self, values: np.ndarray) -> SparseWeight:
        """The same structure with new values (float32 [nnz]); derives nothing."""
        return SparseWeight(self.shape, self.positions, _check_values(values, self.nnz), self._s)

    @property
    def nnz(self) -> int:
        return int(self.positions.size)

    @property
    def density(self) -> float:
        return self.nnz / (self.shape[0] * self.shape[1])

    @property
    def T(self) -> SparseWeightT:
        return SparseWeightT(self)

    def dense(self) -> np.ndarray:
        """W [R, C] float32 with its zeros (cached after the first call: the dense rule's path)."""
        return self._dense

    @cached_property
    def _dense(self) -> np.ndarray:
        w = np.zeros(self.shape[0] * self.shape[1], np.float32)
        w[self.positions] = self.values
        return w.reshape(self.shape)

    @cached_property
    def _csc_values(self) -> np.ndarray:
        return _ro(self.values[self._s.csc_order])  # [nnz], in CSC order: one gather per step

    def __repr__(self) -> str:
        return f"SparseWeight(shape={self.shape}, nnz={self.nnz}, density={self.density:.3f})"


class SparseWeightT:
    """W.T [C, R] of a ``SparseWeight`` W [R, C]: a view, nothing copied."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, base: SparseWeight) -> None:
        self.base = base
        self.shape = (base.shape[1], base.shape[0])

    @property
    def T(self) -> SparseWeight:
        return self.base

    @property
    def nnz(self) -> int:
        return self.base.nnz

    @property
    def density(self) -> float:
        return self.base.density

    def dense(self) -> np.ndarray:
        return self.base.dense().T

    def __repr__(self) -> str:
        return f"SparseWeightT(shape={self.shape}, nnz={self.nnz}, density={self.density:.3f})"


AnySparse = SparseWeight | SparseWeightT


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only view: the kernels take read-only structure arrays, so one signature fits all."""
    v = a.view()
    v.flags.writeable = False
    return v


def _check_values(values: np.ndarray, nnz: int) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype != np.float32 or values.shape != (nnz,):
        raise ValueError(f"SparseWeight values must be float32 [{nnz}] (got {values.dtype} {values.shape})")
    return np.ascontiguousarray(values)  # no copy when contiguous (a read-only view stays one)


def _operand(x: np.ndarray, name: str) -> tuple[np.ndarray, bool]:
    """x [M, K] as the kernels take it: (x, False) if C-contiguous, (x.T, True) if x.T is, else a copy.
    Kernels read their operands through writable arrays (one signature), so a read-only one is copied."""
    if x.dtype != np.float32 or x.ndim != 2:
        raise TypeError(f"sparse products take float32 2-D {name} (got {x.dtype} {x.shape})")
    if x.flags.c_contiguous and x.flags.writeable:
        return x, False
    if x.T.flags.c_contiguous and x.flags.writeable:
        return x.T, True
    return np.ascontiguousarray(x), False


def _spmm_tile(k: int) -> int:
    """Rows per SpMM tile for an input of K columns: the transposed tile [K, tile] stays near 768 KiB
    (L2 is 2 MiB; K = 3072 with 256 rows spilled it and ran 1.8x slower). Any tile gives the same bits."""
    return max(32, min(256, 1 << int(np.log2(max(1, 196608 // k)))))


def _tasks(m: int, tile: int) -> list[tuple[int, int]]:
    """Fixed ranges of row tiles (a function of M only), one per ``run_tasks`` part."""
    tiles = -(-m // tile)
    step = -(-tiles // max(1, min(_PARTS, tiles)))
    return [(t, min(t + step, tiles)) for t in range(0, tiles, step)]


def _spmm(
    x: np.ndarray, ptr: np.ndarray, idx: np.ndarray, val: np.ndarray, out: np.ndarray, bias: np.ndarray | None
) -> np.ndarray:
    """out [M, n_out] = x [M, K] @ S + bias [n_out], where column o of S keeps idx/val[ptr[o]:ptr[o + 1]]."""
    m, n_out = x.shape[0], ptr.shape[0] - 1
    if out.shape != (m, n_out):
        raise ValueError(f"out must be [{m}, {n_out}] (got {out.shape})")
    xk, x_t = _operand(x, "activations")
    if out.dtype != np.float32:
        raise TypeError(f"sparse products write float32 out (got {out.dtype})")
    copy_back = False
    if out.flags.c_contiguous:
        ok, out_t = out, False
    elif out.T.flags.c_contiguous:
        ok, out_t = out.T, True
    else:  # an odd strided view: compute contiguous, then copy in
        ok, out_t, copy_back = np.empty((m, n_out), np.float32), False, True
    b = _ro(
        np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(n_out)
    )
    tile = _spmm_tile(x.shape[1])
    if m:
        K = _kernels()
        run_tasks(
            [partial(K.spmm_tiles, ptr, idx, val, xk, x_t, ok, out_t, b, tile, *t) for t in _tasks(m, tile)]
        )
    if copy_back:
        out[...] = ok
    return out


def sparse_matmul(
    a: np.ndarray, w: AnySparse, out: np.ndarray | None = None, bias: np.ndarray | None = None
) -> np.ndarray:
    """a [M, R] @ W [R, C] -> [M, C] (``w`` a SparseWeight), or a [M, C] @ W.T -> [M, R] (a SparseWeightT),
    with the sparse kernel whatever the rule says. ``bias`` [n_out] is added per output column."""
    if a.shape[1] != w.shape[0]:
        raise ValueError(f"sparse_matmul: a is {a.shape}, weight is {w.shape}")
    if out is None:
        out = np.empty((a.shape[0], w.shape[1]), np.float32)
    if isinstance(w, SparseWeight):  # sum over W's columns: CSC
        s = w._s
        return _spmm(a, s.csc_indptr, s.csc_indices, w._csc_values, out, bias)
    s = w.base._s  # W.T's columns are W's rows: CSR as stored
    return _spmm(a, s.indptr, s.indices, _ro(w.base.values), out, bias)


def sampled_matmul(a: np.ndarray, b: np.ndarray, w: SparseWeight) -> np.ndarray:
    """(a.T @ b)[w's positions] -> float32 [nnz], in positions order, for a [M, R], b [M, C] (SDDMM).

    Never forms a.T @ b: each kept entry is one dot product over M, in fixed tiles and lanes."""
    m = a.shape[0]
    if a.shape[1] != w.shape[0] or b.shape != (m, w.shape[1]):
        raise ValueError(f"sampled_matmul: a is {a.shape}, b is {b.shape}, weight is {w.shape}")
    ak, a_t = _operand(a, "a")
    bk, b_t = _operand(b, "b")
    s = w._s
    K = _kernels()
    parts = _tasks(m, K.TILE)
    outs = np.zeros((max(1, len(parts)), w.nnz), np.float32)  # one partial per part, summed in order
    if m:
        run_tasks(
            [
                partial(K.sddmm_tiles, s.indptr, s.indices, ak, a_t, bk, b_t, outs[i], *t)
                for i, t in enumerate(parts)
            ]
        )
    out: np.ndarray = outs[0]
    for extra in outs[1:]:
        out += extra
    return out


def weight_grad(a: np.ndarray, b: np.ndarray, w: np.ndarray | SparseWeight) -> np.ndarray:
    """The gradient of weight ``w`` where dW = a.T @ b: ``a`` and ``b`` are the product's left and right
    factors of dW (y = x @ W: a = x, b = dy; y = x @ W.T: a = dy, b = x). Dense ``w``: exactly
    ``_blocked.matmul(a.T, b)``, [R, C]. SparseWeight: float32 [nnz], the kept entries only."""
    if not isinstance(w, SparseWeight):
        return matmul(a.T, b)
    if use_sparse_kernels(w.shape, w.density):
        return sampled_matmul(a, b, w)
    kept: np.ndarray = matmul(a.T, b).reshape(-1)[w.positions]
    return kept


def matmul_any(
    a: np.ndarray | AnySparse,
    b: np.ndarray | AnySparse,
    out: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """``_blocked.matmul`` where either operand may be a SparseWeight / SparseWeightT: a [M, K] @ b [K, N]
    (+ bias: [N] per column or [M, 1] per row) -> out [M, N]. A weight the rule sends dense is densified
    (cached) and multiplied by ``_blocked.matmul``; a sparse left operand is computed as
    out.T = b.T @ a.T, written through out.T."""
    row_bias = bias if bias is not None and bias.ndim == 2 else None
    column_bias = bias if bias is not None and bias.ndim != 2 else None
    if isinstance(b, SparseWeight | SparseWeightT):
        if isinstance(a, SparseWeight | SparseWeightT):
            raise TypeError("matmul_any: at most one operand may be sparse")
        if not use_sparse_kernels(b.shape, b.density):
            return matmul(a, b.dense(), out=out, bias=bias)
        out = _sparse_out(a, b, out)
        # bias per output column rides in the kernel; per row is added after
        sparse_matmul(a, b, out=out, bias=column_bias)
        if row_bias is not None:
            out += row_bias
        return out
    if not isinstance(a, SparseWeight | SparseWeightT):
        return matmul(a, b, out=out, bias=bias)
    if not use_sparse_kernels(a.shape, a.density):
        return matmul(a.dense(), b, out=out, bias=bias)
    out = _sparse_out(a, b, out)
    sparse_matmul(b.T, a.T, out=out.T, bias=None if row_bias is None else row_bias[:, 0])  # out.T [N, M]
    if column_bias is not None:
        out += column_bias
    return out


def _sparse_out(a: np.ndarray | AnySparse, b: np.ndarray | AnySparse, out: np.ndarray | None) -> np.ndarray:
    """``out`` of a [M, K] @ b [K, N] (new float32 [M, N] where None), after checking the shapes agree."""
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul_any: a is {a.shape}, b is {b.shape}")
    return np.empty((a.shape[0], b.shape[1]), np.float32) if out is None else out

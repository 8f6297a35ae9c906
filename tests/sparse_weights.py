"""Sparse weights for the kernel tests (numerics/sparse.py): a seeded random weight, operands laid out as
the worker passes them, and a digest of every kernel's output that a test compares across runs and thread
counts (``tests.model_checks.digest_with_threads`` runs it in a process of its own)."""

from __future__ import annotations

import hashlib

import numpy as np

from weightstream.numerics.sparse import SparseWeight, matmul_any, sampled_matmul, sparse_matmul, weight_grad

SPARSE_SHAPE = (320, 256)  # 81920 elements: big enough that the rule picks sparse at 0.1


def sparse_weight(shape: tuple[int, int], density: float, seed: int = 0, edge: bool = False) -> SparseWeight:
    rng = np.random.default_rng(seed)
    keep = rng.random(shape) < density
    if edge:  # an empty row and an empty column
        keep[3, :] = False
        keep[:, 5] = False
    positions = np.flatnonzero(keep).astype(np.int64)
    return SparseWeight.from_positions(
        shape, positions, rng.standard_normal(positions.size, dtype=np.float32)
    )


def transposed_copy(a: np.ndarray) -> np.ndarray:
    """The same values as ``a``, as a transposed (F-ordered) view: the worker's a_t.T operands."""
    return np.ascontiguousarray(a.T).T


def kernels_digest() -> str:
    """Every kernel and layout on shapes with several tiles and parts, digested. 1000 rows: four tiles
    in two parts, so a part split that followed the thread count would change the sums' grouping."""
    r, c = SPARSE_SHAPE
    w = sparse_weight(SPARSE_SHAPE, 0.1, seed=7)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1000, r), dtype=np.float32)
    dy = rng.standard_normal((1000, c), dtype=np.float32)
    outs = [
        sparse_matmul(x, w),
        sparse_matmul(transposed_copy(x), w),
        sparse_matmul(dy, w.T),
        matmul_any(w.T, x.T),
        sampled_matmul(x, dy, w),
        sampled_matmul(transposed_copy(x), transposed_copy(dy), w),
        weight_grad(dy, x, sparse_weight((c, r), 0.1, seed=9)),
    ]
    h = hashlib.sha256()
    for o in outs:
        h.update(np.ascontiguousarray(o).tobytes())
    return h.hexdigest()

"""Sparse weight kernels against dense products on GPT-2 d768 shapes: what ``use_sparse_kernels`` is tuned by.

Prints one JSON line: per weight shape and density, the dense (``_blocked.matmul``) and sparse ms of the
forward (x @ W), dx (dy @ W.T) and dW (dense x.T @ dy against the sampled product), the sparse/dense
ratio of their sum, and the rule's choice; plus each kernel's first-call time (compilation, or loading
numba's on-disk cache when it is warm). Dense and sparse run interleaved, best of ``--repeats``, so the
ratios hold on a shared, noisy machine. Usage:

    python bench/sparse_kernels.py [--rows 2048 --repeats 5 --sparsities 0.5 0.75 0.9 0.95]

A cold compile: NUMBA_CACHE_DIR=$(mktemp -d) python bench/sparse_kernels.py
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.numerics._blocked import THREADS, matmul
from weightstream.numerics.sparse import SparseWeight, sampled_matmul, sparse_matmul, use_sparse_kernels

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))  # GPT-2 d768: c_attn, c_proj, c_fc, mlp c_proj


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-touch page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def random_weight(shape: tuple[int, int], sparsity: float, rng: np.random.Generator) -> SparseWeight:
    rows, cols = shape
    positions = np.flatnonzero(rng.random(rows * cols) >= sparsity).astype(np.int64)
    return SparseWeight.from_positions(
        shape, positions, rng.standard_normal(positions.size, dtype=np.float32)
    )


def first_calls(rng: np.random.Generator) -> dict[str, float]:
    """Seconds of each kernel's first call in this process, on a small problem (compile or cache load)."""
    w = random_weight((64, 48), 0.9, rng)
    x, dy = rng.standard_normal((40, 64), dtype=np.float32), rng.standard_normal((40, 48), dtype=np.float32)
    result = {}
    for name, fn in (
        ("forward_s", lambda: sparse_matmul(x, w)),
        ("dx_s", lambda: sparse_matmul(dy, w.T)),
        ("dW_s", lambda: sampled_matmul(x, dy, w)),
    ):
        t0 = time.perf_counter()
        fn()
        result[name] = round(time.perf_counter() - t0, 3)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048, help="activation rows M (batch x sequence)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.5, 0.75, 0.9, 0.95])
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    compile_s = first_calls(rng)
    rows = []
    for shape in SHAPES:
        r, c = shape
        x = rng.standard_normal((a.rows, r), dtype=np.float32)
        dy = rng.standard_normal((a.rows, c), dtype=np.float32)
        w_dense = rng.standard_normal(shape, dtype=np.float32)
        for sparsity in a.sparsities:
            w = random_weight(shape, sparsity, rng)
            density = round(1.0 - sparsity, 6)
            dense = [
                best_ms(partial(matmul, x, w_dense), a.repeats),
                best_ms(partial(matmul, dy, w_dense.T), a.repeats),
                best_ms(partial(matmul, x.T, dy), a.repeats),
            ]
            sparse = [
                best_ms(partial(sparse_matmul, x, w), a.repeats),
                best_ms(partial(sparse_matmul, dy, w.T), a.repeats),
                best_ms(partial(sampled_matmul, x, dy, w), a.repeats),
            ]
            rows.append(
                {
                    "shape": list(shape),
                    "sparsity": sparsity,
                    "dense_ms": {k: round(v, 2) for k, v in zip(("forward", "dx", "dW"), dense, strict=True)},
                    "sparse_ms": {
                        k: round(v, 2) for k, v in zip(("forward", "dx", "dW"), sparse, strict=True)
                    },
                    "sparse_over_dense": round(sum(sparse) / sum(dense), 3),
                    "rule": "sparse" if use_sparse_kernels(shape, density) else "dense",
                }
            )
    result = {
        "bench": "sparse_kernels",
        "config": vars(a),
        "machine": {"numpy": np.__version__},  # beside record()'s CPU, cores, RAM and Python
        "numpy_threads": THREADS,
        "first_call_s": compile_s,
        "results": rows,
    }
    print(json.dumps(record("sparse_kernels", result)))


if __name__ == "__main__":
    main()

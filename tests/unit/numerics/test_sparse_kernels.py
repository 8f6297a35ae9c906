"""The sparse weight kernels (numerics/sparse.py, _sparse_kernels.py): equal to the dense products on the
masked weight (torch float64 reference), and the dense/sparse rule as tuned. Bitwise reproducibility
across reruns and thread counts is in tests/integration/test_sparse_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.testing import assert_allclose, assert_array_equal

from tests.sparse_weights import SPARSE_SHAPE, sparse_weight, transposed_copy
from weightstream.numerics._blocked import matmul
from weightstream.numerics.sparse import (
    SparseWeight,
    matmul_any,
    sampled_matmul,
    sparse_matmul,
    use_sparse_kernels,
    weight_grad,
)

M = 600  # three row tiles of 256 (the last one partial), split in two parts


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).double()


CASES = [((40, 48), 0.05, False), ((40, 48), 0.1, True), ((64, 24), 0.5, False), ((24, 64), 1.0, False)]


@pytest.mark.parametrize(("shape", "density", "edge"), CASES)
@pytest.mark.parametrize("layout", ["c", "transposed", "x_transposed", "dy_transposed"])
def test_products_equal_the_dense_masked_products(
    shape: tuple[int, int], density: float, edge: bool, layout: str
) -> None:
    w = sparse_weight(shape, density, edge=edge)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, shape[0]), dtype=np.float32)
    dy = rng.standard_normal((M, shape[1]), dtype=np.float32)
    if layout in ("transposed", "x_transposed"):
        x = transposed_copy(x)
    if layout in ("transposed", "dy_transposed"):
        dy = transposed_copy(dy)
    wd = _t(w.dense())
    assert_allclose(w.dense().reshape(-1)[w.positions], w.values)
    assert np.count_nonzero(w.dense()) == np.count_nonzero(w.values)
    assert_allclose(sparse_matmul(x, w), (_t(x) @ wd).numpy(), rtol=1e-5, atol=1e-5)  # forward
    assert_allclose(sparse_matmul(dy, w.T), (_t(dy) @ wd.T).numpy(), rtol=1e-5, atol=1e-5)  # dx
    full = (_t(x).T @ _t(dy)).numpy().reshape(-1)
    assert_allclose(sampled_matmul(x, dy, w), full[w.positions], rtol=1e-5, atol=1e-4)  # dW


@pytest.mark.parametrize("out_layout", ["c", "transposed", "strided"])
def test_outputs_may_be_strided_views(out_layout: str) -> None:
    w = sparse_weight((40, 48), 0.1)
    x = np.random.default_rng(2).standard_normal((M, 40), dtype=np.float32)
    bias = np.arange(48, dtype=np.float32)
    base = {
        "c": np.empty((M, 48), np.float32),
        "transposed": np.empty((48, M), np.float32).T,
        "strided": np.empty((M, 96), np.float32)[:, ::2],
    }[out_layout]
    y = sparse_matmul(x, w, out=base, bias=bias)
    assert y is base
    assert_allclose(y, (_t(x) @ _t(w.dense())).numpy() + bias, rtol=1e-5, atol=1e-5)


def test_nnz_zero_gives_zeros() -> None:
    w = SparseWeight.from_positions((30, 20), np.zeros(0, np.int64), np.zeros(0, np.float32))
    x = np.ones((M, 30), np.float32)
    assert_array_equal(sparse_matmul(x, w), np.zeros((M, 20), np.float32))
    assert_array_equal(sparse_matmul(np.ones((M, 20), np.float32), w.T), np.zeros((M, 30), np.float32))
    assert sampled_matmul(x, np.ones((M, 20), np.float32), w).shape == (0,)


def test_matmul_any_sparse_operands_as_the_worker_calls_them() -> None:
    """GPT-2's calls: W.T @ h.T with a row bias (sparse left, out [3C, N]), a_t.T @ W, W @ d.T into a
    given out, d.T @ W.T; LLaMA's x @ W.T with a column bias."""
    w = sparse_weight(SPARSE_SHAPE, 0.1)
    assert use_sparse_kernels(w.shape, w.density)
    rng = np.random.default_rng(3)
    r, c = SPARSE_SHAPE
    h = rng.standard_normal((M, r), dtype=np.float32)
    d = rng.standard_normal((M, c), dtype=np.float32)
    wd = _t(w.dense())
    row_bias = rng.standard_normal((c, 1), dtype=np.float32)
    col_bias = rng.standard_normal(r, dtype=np.float32)
    m_bias = rng.standard_normal(M, dtype=np.float32)
    checks = [
        (matmul_any(w.T, h.T, bias=row_bias), wd.T @ _t(h).T + _t(row_bias)),
        (matmul_any(transposed_copy(h), w), _t(h) @ wd),
        (matmul_any(w, d.T, out=np.empty((r, M), np.float32)), wd @ _t(d).T),
        (matmul_any(transposed_copy(d), w.T), _t(d) @ wd.T),
        (matmul_any(d, w.T, bias=col_bias), _t(d) @ wd.T + _t(col_bias)),
        (matmul_any(w, d.T, bias=m_bias), wd @ _t(d).T + _t(m_bias)),  # sparse left, column bias
        (matmul_any(h, w, bias=m_bias[:, None]), _t(h) @ wd + _t(m_bias[:, None])),  # sparse right, row bias
    ]
    for got, want in checks:
        assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-4)
    with pytest.raises(TypeError, match="at most one operand"):
        matmul_any(w, w.T)


def test_matmul_any_dense_is_blocked_matmul_bytes() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((M, 300), dtype=np.float32)
    b = rng.standard_normal((300, 200), dtype=np.float32)
    bias = rng.standard_normal(200, dtype=np.float32)
    assert matmul_any(a, b, bias=bias).tobytes() == matmul(a, b, bias=bias).tobytes()
    w = sparse_weight(SPARSE_SHAPE, 0.5)  # the rule says dense: the densified weight through _blocked.matmul
    assert not use_sparse_kernels(w.shape, w.density)
    x = rng.standard_normal((M, SPARSE_SHAPE[0]), dtype=np.float32)
    assert matmul_any(x, w).tobytes() == matmul(x, w.dense()).tobytes()


def test_weight_grad() -> None:
    rng = np.random.default_rng(5)
    r, c = SPARSE_SHAPE
    x = rng.standard_normal((M, r), dtype=np.float32)
    dy = rng.standard_normal((M, c), dtype=np.float32)
    dense_w = rng.standard_normal(SPARSE_SHAPE, dtype=np.float32)
    assert weight_grad(x, dy, dense_w).tobytes() == matmul(x.T, dy).tobytes()
    full = (_t(x).T @ _t(dy)).numpy().reshape(-1)
    for density in (0.1, 0.5):  # sparse rule, dense rule
        w = sparse_weight(SPARSE_SHAPE, density)
        assert_allclose(weight_grad(x, dy, w), full[w.positions], rtol=1e-5, atol=1e-4)
    # the dense rule gathers the dense product's bytes, so those entries match a dense run's exactly
    dense_bytes = matmul(x.T, dy).reshape(-1)[w.positions].tobytes()
    assert not use_sparse_kernels(w.shape, w.density) and weight_grad(x, dy, w).tobytes() == dense_bytes
    # LLaMA's transposed use: y = x @ W.T with W [out, in]: dW = dy.T @ x, i.e. weight_grad(dy, x, W)
    w = sparse_weight((c, r), 0.1)
    assert_allclose(weight_grad(dy, x, w), (_t(dy).T @ _t(x)).numpy().reshape(-1)[w.positions], atol=1e-4)


def test_with_values_reuses_the_structure() -> None:
    w = sparse_weight((40, 48), 0.1)
    new = np.arange(w.nnz, dtype=np.float32)
    new.flags.writeable = False  # values may arrive read-only (a view of a received buffer)
    w2 = w.with_values(new)
    assert w2._s is w._s
    x = np.random.default_rng(6).standard_normal((M, 40), dtype=np.float32)
    assert_allclose(sparse_matmul(x, w2), (_t(x) @ _t(w2.dense())).numpy(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(
    ("positions", "values", "match"),
    [
        (np.array([3, 2], np.int64), np.zeros(2, np.float32), "strictly ascending"),
        (np.array([2, 2], np.int64), np.zeros(2, np.float32), "strictly ascending"),
        (np.array([0, 20], np.int64), np.zeros(2, np.float32), r"lie in \[0, 20\)"),
        (np.array([0, 1], np.int32), np.zeros(2, np.float32), "int64"),
        (np.array([0, 1], np.int64), np.zeros(2, np.float64), "float32"),
    ],
)
def test_from_positions_rejects_bad_input(positions: np.ndarray, values: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SparseWeight.from_positions((4, 5), positions, values)


def test_the_rule() -> None:
    for shape in ((768, 2304), (768, 768), (768, 3072), (3072, 768)):
        assert use_sparse_kernels(shape, 0.1)
        assert use_sparse_kernels(shape, 0.05)
        assert not use_sparse_kernels(shape, 0.5)
        assert not use_sparse_kernels(shape, 1.0)
        assert not use_sparse_kernels(shape, 0.25)  # measured 1.24-1.32x dense there
    assert not use_sparse_kernels((64, 64), 0.01)  # tiny: dense
    # the documented bounds: density <= 0.15 (break-even measured near 0.18) and 64 Ki entries
    assert use_sparse_kernels((768, 768), 0.15) and not use_sparse_kernels((768, 768), 0.2)
    assert use_sparse_kernels((256, 256), 0.1) and not use_sparse_kernels((255, 256), 0.1)

"""A GPT-2 block with sparse weights: the same forward and gradients as the dense block on the masked
weights, gradients of sparse weights as their kept entries only, and no dense product of a sparse weight
anywhere (the worker skips the zeros)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np
import pytest
from numpy.testing import assert_allclose

from weightstream.numerics import sparse as sparse_module
from weightstream.numerics.gpt2 import BlockUnit
from weightstream.numerics.llama import LlamaConfig, build_llama
from weightstream.numerics.model import Params
from weightstream.numerics.sparse import SparseWeight, use_sparse_kernels
from weightstream.numerics.sparse_masks import SparsitySpec, make_positions

C, F, H = 256, 1024, 4  # the smallest width at which the rule sends every block weight to the kernels


def _block_params(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, SparseWeight]]:
    p = "transformer.h.0."
    shapes = {
        "attn.c_attn.weight": (C, 3 * C),
        "attn.c_proj.weight": (C, C),
        "mlp.c_fc.weight": (C, F),
        "mlp.c_proj.weight": (F, C),
    }
    dense: dict[str, np.ndarray] = {}
    for k, n in (("ln_1", C), ("ln_2", C)):
        dense[p + k + ".weight"] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        dense[p + k + ".bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
    for k, n in (("attn.c_attn", 3 * C), ("attn.c_proj", C), ("mlp.c_fc", F), ("mlp.c_proj", C)):
        dense[p + k + ".bias"] = (0.02 * rng.standard_normal(n)).astype(np.float32)
    sparse: dict[str, SparseWeight] = {}
    for k, shape in shapes.items():
        w = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        pos = make_positions(p + k, shape, SparsitySpec(0.9, "random", seed=5), w)
        sparse[p + k] = SparseWeight.from_positions(shape, pos, w.reshape(-1)[pos])
        assert use_sparse_kernels(shape, sparse[p + k].density), k
    return dense, sparse


def test_sparse_block_equals_the_dense_block_on_masked_weights_without_dense_products(
    rng, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = BlockUnit(0, H, 1e-5)
    dense, sparse = _block_params(rng)
    masked = {**dense, **{n: w.dense().copy() for n, w in sparse.items()}}
    x = rng.standard_normal((2, 64, C)).astype(np.float32)
    dy = rng.standard_normal((2, 64, C)).astype(np.float32)
    y_ref, saved = block.forward(masked, x)
    dx_ref, g_ref = block.backward(masked, saved, dy.copy())

    def no_dense(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("a dense product of a sparse weight")

    monkeypatch.setattr(sparse_module, "matmul", no_dense)  # sparse.py's only way to a dense product
    y, saved = block.forward(_with_sparse(dense, sparse), x)
    dx, g = block.backward(_with_sparse(dense, sparse), saved, dy.copy())
    close(y, y_ref, "y")
    close(dx, dx_ref, "dx")
    for n, w in sparse.items():
        assert g[n].shape == (w.nnz,)  # the kept entries only: what goes back on the wire
        close(g[n], g_ref[n].reshape(-1)[w.positions], n)
    for n in dense:
        close(g[n], g_ref[n], n)


def _with_sparse(dense: Params, sparse: Mapping[str, SparseWeight]) -> Params:
    """``dense`` with the ``sparse`` weights in their places: a SparseWeight stands where its dense array
    would (the numerics take either, as the worker's assembled units do)."""
    return cast(Params, {**dense, **sparse})


def close(got: np.ndarray | None, want: np.ndarray | None, what: str) -> None:
    """float32 sums in another order: within 1e-5 of the tensor's largest magnitude, entry by entry."""
    assert got is not None and want is not None, what
    assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()), err_msg=what)


@pytest.mark.parametrize("kv_heads,bias,only", [(4, True, None), (2, False, None), (4, False, "q_proj")])
def test_sparse_llama_layer_equals_the_dense_layer_on_masked_weights(
    rng, monkeypatch: pytest.MonkeyPatch, kv_heads: int, bias: bool, only: str | None
) -> None:
    """LLaMA's [out, in] weights used transposed, q/k/v with row biases, grouped-query k/v (their
    [KV D, C] weights too small for the kernels: densified by the rule), and the q/k/v backward that
    cannot stack sparse weights, also when only q is sparse (ModelZoo's ``*proj_q_dense_layer.weight``)."""
    cfg = LlamaConfig(64, 64, C, 1, 4, kv_heads, F, attention_bias=bias, mlp_bias=bias)
    model = build_llama(cfg)
    layer = model.units[1]
    weights = {
        n: (0.1 * rng.standard_normal(model.specs[n].shape)).astype(np.float32) for n in layer.param_names
    }
    sparse = {}
    for n in layer.param_names:
        if n in model.sparse_candidates and (only is None or f".{only}." in n):
            shape = model.specs[n].shape
            assert len(shape) == 2  # a sparse candidate is a matrix
            pos = make_positions(n, shape, SparsitySpec(0.9, "random", seed=5), weights[n])
            sparse[n] = SparseWeight.from_positions(shape, pos, weights[n].reshape(-1)[pos])
    assert len(sparse) == (7 if only is None else 1) and any(
        use_sparse_kernels(w.shape, w.density) for w in sparse.values()
    )
    masked = {**weights, **{n: w.dense().copy() for n, w in sparse.items()}}
    x = rng.standard_normal((2, 32, C)).astype(np.float32)
    dy = rng.standard_normal((2, 32, C)).astype(np.float32)
    y_ref, saved = layer.forward(masked, x)
    dx_ref, g_ref = layer.backward(masked, saved, dy.copy())
    y, saved = layer.forward(_with_sparse(weights, sparse), x)
    dx, g = layer.backward(_with_sparse(weights, sparse), saved, dy.copy())
    close(y, y_ref, "y")
    close(dx, dx_ref, "dx")
    for n in layer.param_names:
        want = g_ref[n].reshape(-1)[sparse[n].positions] if n in sparse else g_ref[n]
        close(g[n], want, n)

"""The worker's side of a sparse weight: values + index in, SparseWeight out, its structure reused while
the index stays the same and rebuilt when it changes; indexes for tensors that cannot be sparse refused."""

from __future__ import annotations

import numpy as np
import pytest

from tests.params_files import TINY
from weightstream.numerics.sparse import SparseWeight
from weightstream.params import load_params, model_def
from weightstream.transport.errors import ProtocolError
from weightstream.transport.sparse import decode_index, encode_index, index_name
from weightstream.worker.sparse import SparseAssembler

C_FC = "transformer.h.0.mlp.c_fc.weight"  # [32, 64] in TINY


def _wire(rng, keep: int, name: str = C_FC, numel: int = 32 * 64) -> dict[str, np.ndarray]:
    positions = np.sort(rng.permutation(numel)[:keep]).astype(np.int64)
    kind, data = encode_index(positions, numel)
    return {name: rng.standard_normal(keep).astype(np.float32), index_name(name, kind): data}


def test_values_and_index_become_a_sparse_weight_whose_structure_is_reused(rng) -> None:
    assemble = SparseAssembler(model_def(load_params(TINY)))
    first = _wire(rng, 200)
    bias = rng.standard_normal(64).astype(np.float32)
    got = assemble({**first, "transformer.h.0.mlp.c_fc.bias": bias})
    w = got[C_FC]
    assert isinstance(w, SparseWeight) and w.shape == (32, 64) and w.nnz == 200
    assert got["transformer.h.0.mlp.c_fc.bias"] is bias  # dense tensors pass through untouched
    dense = np.zeros(32 * 64, np.float32)
    kind_key = next(k for k in first if "::" in k)
    positions = decode_index(C_FC, kind_key.split("::")[1], first[kind_key], 32 * 64, 200)
    dense[positions] = first[C_FC]
    assert np.array_equal(w.dense(), dense.reshape(32, 64))
    next_step = {**first, C_FC: rng.standard_normal(200).astype(np.float32)}  # same mask, new values
    w2 = assemble(next_step)[C_FC]
    assert isinstance(w2, SparseWeight)
    assert w2._s is w._s and np.array_equal(w2.values, next_step[C_FC])  # structure reused
    other = _wire(rng, 200)  # another mask of the same size: rebuilt, not reused
    w3 = assemble(other)[C_FC]
    assert isinstance(w3, SparseWeight)
    assert w3._s is not w._s and not np.array_equal(w3.positions, w.positions)


def test_an_index_for_a_tensor_that_cannot_be_sparse_is_refused(rng) -> None:
    assemble = SparseAssembler(model_def(load_params(TINY)))
    with pytest.raises(ProtocolError, match="cannot be a sparse weight"):
        assemble(_wire(rng, 100, "transformer.wte.weight", 64 * 32))
    with pytest.raises(ProtocolError, match="values came"):  # values and index disagree
        bad = _wire(rng, 100)
        bad[C_FC] = bad[C_FC][:99]
        assemble(bad)


def test_values_that_are_not_1d_are_a_protocol_error(rng) -> None:
    """A peer sending the kept values with a shape (a dense-shaped or [nnz, 1] tensor) breaks the wire
    format: refused as a ProtocolError naming the tensor, on the first step and once the structure is
    cached alike."""
    assemble = SparseAssembler(model_def(load_params(TINY)))
    good = _wire(rng, 200)
    bad = {**good, C_FC: good[C_FC].reshape(200, 1)}
    with pytest.raises(ProtocolError, match=r"c_fc\.weight: sparse values must be 1-D"):
        assemble(bad)
    assemble(good)
    with pytest.raises(ProtocolError, match="1-D"):
        assemble(bad)

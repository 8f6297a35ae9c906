"""A shard's sparse tensors alone (memoryx/sparse.py): compact and dense forms and the blocks a checkpoint
is written from agree (masks made again, gmp, are in test_gmp_shard.py)."""

from __future__ import annotations

import numpy as np
import pytest

from weightstream.memoryx import sparse as sparse_module
from weightstream.memoryx.sparse import SparseTensors
from weightstream.numerics.sparse_masks import SparsitySpec


def test_compact_dense_and_the_checkpoints_blocks_agree(monkeypatch: pytest.MonkeyPatch, rng) -> None:
    monkeypatch.setattr(sparse_module, "BLOCK_ELEMENTS", 7)  # blocks that cut rows, the last one short
    shape = (6, 5)
    sparse = SparseTensors({"w": SparsitySpec(0.6, "random", seed=3)}, {"w": shape})
    w = rng.standard_normal(shape).astype(np.float32)
    compact = sparse.make("w", w)
    kept = sparse.positions("w")
    assert compact.shape == sparse.compact_shape("w") == (len(kept),) and np.all(np.diff(kept) > 0)
    dense = sparse.dense("w", compact)
    assert np.array_equal(dense.reshape(-1)[kept], w.reshape(-1)[kept]) and np.count_nonzero(dense) <= len(
        kept
    )
    assert np.array_equal(sparse.compact("w", dense), compact)
    blocks = [b.copy() for b in sparse.dense_blocks("w", compact)]  # one buffer, reused: copied here
    assert [len(b) for b in blocks] == [7, 7, 7, 7, 2] and np.array_equal(
        np.concatenate(blocks), dense.reshape(-1)
    )
    mask = np.concatenate([b.copy() for b in sparse.mask_blocks("w")])
    assert np.array_equal(np.flatnonzero(mask), kept)
    assert sparse.density() == len(kept) / 30 and "w" in sparse and len(sparse) == 1

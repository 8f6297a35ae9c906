"""What a shard holds (memoryx/state.py) alone: initial weights from the seed in either store, bit for bit,
sparse tensors compact with zeros elsewhere, state at zero, and which units use each tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.memoryx_shards import tiny_state
from tests.params_files import TINY
from weightstream.memoryx.store import DiskStore, MemoryStore
from weightstream.numerics.model import init_tensor

SPARSE = {**TINY, "sparsity": {"sparsity": 0.75, "init_method": "random"}}


def test_the_seeds_weights_go_into_either_store_bit_for_bit_sparse_ones_compact(tmp_path: Path) -> None:
    memory, disk = tiny_state(MemoryStore(), SPARSE), tiny_state(DiskStore(tmp_path / "mx"), SPARSE)
    for state in (memory, disk):
        state.fill(seed=7)
    assert memory.users["transformer.wte.weight"] == (0, 3) and memory.users["transformer.wpe.weight"] == (0,)
    for n in memory.names:
        spec = memory.model.specs[n]
        assert np.array_equal(memory.weight(n), disk.weight(n)), n
        dense = memory.dense(n)
        if n in memory.sparse:
            kept = memory.sparse.positions(n)
            assert memory.shape(n) == (len(kept),) and 0 < len(kept) < spec.numel
            assert np.array_equal(dense.reshape(-1)[kept], init_tensor(spec, 7).reshape(-1)[kept])
            assert np.count_nonzero(dense) <= len(kept)
        else:
            assert memory.shape(n) == spec.shape and np.array_equal(dense, init_tensor(spec, 7))
        for key in memory.state_keys[n]:
            assert memory.tensor_of(key) == n and not memory.dense(key).any()
            assert memory.dense(key).shape == spec.shape
        assert set(memory.state(n)) == {"exp_avg", "exp_avg_sq"}
    disk.store.close()

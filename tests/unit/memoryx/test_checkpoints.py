"""A shard's checkpoints alone (memoryx/checkpoints.py), over its state and progress: a checkpoint waits for
the update in flight and is of one step, and loads back bit for bit into the other store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.memoryx_shards import WAIT_S, in_thread, tiny_state
from tests.params_files import TINY
from weightstream.checkpoint_layout import MASKS, TRAINER_STATE
from weightstream.memoryx.checkpoints import load_checkpoint, write_checkpoint
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.store import DiskStore, MemoryStore

SPARSE = {**TINY, "sparsity": {"sparsity": 0.75, "init_method": "random"}}


def test_a_checkpoint_waits_for_the_update_in_flight_and_loads_back_bitwise(tmp_path: Path) -> None:
    state = tiny_state(MemoryStore(), SPARSE)
    state.fill(seed=7)
    progress = ShardProgress(WAIT_S)
    names = list(state.names)
    keys = [k for n in names for k in state.state_keys[n]]
    masks = list(state.sparse.specs)
    with progress:
        progress.begin_update(0)
    files = ([(tmp_path / "model.safetensors", names)], [(tmp_path / "optimizer.safetensors", keys)])
    writer, _ = in_thread(
        lambda: write_checkpoint(state, progress, 1, *files, [(tmp_path / f"{MASKS}.safetensors", masks)])
    )
    assert progress.wait_for_waiters(1, WAIT_S), "a checkpoint must wait for the update in flight"
    assert not (tmp_path / "model.safetensors").exists()
    with progress:  # the update's end: every weight and state buffer one step on
        for n in names:
            for key in (n, *state.state_keys[n]):
                state.store.get(key)[...] += 1
        progress.step = 1
        progress.end_update()
    writer.join(WAIT_S)
    assert (tmp_path / "model.safetensors").exists()
    (tmp_path / TRAINER_STATE).write_text(json.dumps({"global_step": 1}))
    loaded = tiny_state(DiskStore(tmp_path / "mx"), SPARSE)
    assert load_checkpoint(loaded, str(tmp_path)) == 1
    for n in masks:
        assert np.array_equal(loaded.sparse.positions(n), state.sparse.positions(n)), n
    for key in (*names, *keys):  # the values after the update, bit for bit
        assert np.array_equal(loaded.dense(key).view(np.uint32), state.dense(key).view(np.uint32)), key
    loaded.store.close()


def test_a_checkpoint_of_another_step_is_refused(tmp_path: Path) -> None:
    state = tiny_state(MemoryStore())
    state.fill(seed=7)
    with pytest.raises(ValueError, match="checkpoint of step 2 requested, shard is at step 1"):
        write_checkpoint(state, ShardProgress(WAIT_S, step=1), 2, [(tmp_path / "m.safetensors", ["x"])], [])
    assert not list(tmp_path.iterdir())

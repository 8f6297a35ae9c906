"""A MemoryX shard in memory mode updates the first unit's tensors (the next step's workers wait for them)
on two cores: its norm thread, idle by then, takes the second half of each large one (memoryx/update.py,
``optimizer_step``'s ``helper``). The weights and optimizer state must keep the bits of one pass: those of
a disk-mode shard, which updates every tensor alone."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from tests.executors import CountingHelper
from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.numerics.optim import SPLIT_UPDATE
from weightstream.params import load_params, model_def, optimizer_config


def test_the_first_units_large_tensors_are_updated_in_two_halves_with_one_pass_bits(tmp_path: Path) -> None:
    raw = copy.deepcopy(TINY)
    raw["model"]["vocab_size"] = SPLIT_UPDATE // raw["model"]["hidden_size"] + 1  # wte just past the split
    p = load_params(raw)
    model, opt = model_def(p), optimizer_config(p.optimizer)
    wte = "transformer.wte.weight"
    assert model.specs[wte].numel >= SPLIT_UPDATE
    rng = np.random.default_rng(5)
    grads = [
        {n: rng.standard_normal(model.specs[n].shape).astype(np.float32) for n in unit.param_names}
        for unit in model.units
    ]
    shards = []
    for storage in (None, tmp_path / "disk"):
        shard = MemoryXShard(model, opt, list(model.specs), seed=7, timeout_s=10, storage_dir=storage)
        if storage is None:
            assert shard.gradients.background is not None
            shard.gradients.background.shutdown()
            shard.gradients.background = helper = CountingHelper()
        for step in range(2):
            for u in reversed(range(len(model.units))):
                shard.add_gradient(step, u, {n: g * (step + 1) for n, g in grads[u].items()})
            shard.apply_update(step, lr=1e-2, clip_coef=0.5)
        shards.append(shard)
    # wte (tied: units 0 and the head) is the first unit's only tensor past the split; one half a step
    assert helper.sizes == [model.specs[wte].numel - model.specs[wte].numel // 2] * 2
    memory, disk = shards
    for n in model.specs:
        for key in (n, *memory.state_keys[n]):
            a, b = memory.store.get(key), disk.store.get(key)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), key
    for shard in shards:
        shard.close()

"""Disk-backed MemoryX (runconfig.memoryx_storage: disk): the store, the shard on it, and the streaming
checkpoint files. The end-to-end bitwise comparison with memory mode is in tests/integration."""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pytest
from safetensors.numpy import load_file

from tests.params_files import TINY
from weightstream.checkpoint_layout import checkpoint_files
from weightstream.memoryx import service as memoryx_service
from weightstream.memoryx import store as store_module
from weightstream.memoryx.shard import MemoryXShard
from weightstream.memoryx.storage import iter_tensors, write_safetensors
from weightstream.memoryx.store import DiskStore, MemoryStore
from weightstream.numerics.optim import SUM_BLOCK, add_sq_sum, grad_sq_sum
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.plan import JobSpec, make_plan
from weightstream.transport.shm import SharedArena


def test_disk_store_keeps_tensors_in_files_and_zeros_as_holes(tmp_path: Path, rng) -> None:
    store = DiskStore(tmp_path / "s")
    w = rng.standard_normal((300, 7)).astype(np.float32)
    store.put("w", w)
    store.zeros("m", (1000, 1000))
    assert np.array_equal(np.fromfile(tmp_path / "s" / "w.f32", dtype=np.float32), w.reshape(-1))
    assert np.array_equal(store.get("w"), w) and store.get("w") is not store.get("w")  # fresh reads
    assert (tmp_path / "s" / "m.f32").stat().st_size == 4_000_000
    assert os.stat(tmp_path / "s" / "m.f32").st_blocks == 0  # a hole until written
    assert not store.get("m").any()
    store.drop("w")
    assert not (tmp_path / "s" / "w.f32").exists()
    store.close()
    assert not (tmp_path / "s").exists()


def test_disk_store_updates_block_by_block_bitwise_as_the_memory_store(
    tmp_path: Path, rng, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "BLOCK_ELEMENTS", 1000)  # many blocks, the last one short
    a, b = rng.standard_normal((2, 12345)).astype(np.float32)

    def fn(blocks: list[np.ndarray]) -> None:
        x, y = blocks
        x *= np.float32(0.9)
        x += np.sqrt(np.abs(y)) / (y + np.float32(3.0))
        y[...] = 0  # not in ``write``: must not reach the file

    results = []
    for store in (MemoryStore(), DiskStore(tmp_path / "d")):
        store.put("a", a.copy())
        store.put("b", b.copy())
        store.update(["a", "b"], fn, write=["a"])
        results.append((store.get("a").copy(), store.get("b").copy()))
        store.close()
    (mem_a, _), (disk_a, disk_b) = results
    assert np.array_equal(mem_a, disk_a)  # bitwise, whatever the blocks
    assert np.array_equal(disk_b, b)


def test_what_the_shard_may_do_with_a_store_the_store_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each store answers for itself (no caller asks which it is): whether another thread may sum its
    arrays, where its weights are shared, what a buffer wanted again next step costs, what the disk did."""
    arena = SharedArena("store-test")
    stores = {"memory": MemoryStore(arena, ["w"]), "disk": DiskStore(tmp_path / "d")}
    assert stores["memory"].resident and not stores["disk"].resident
    assert stores["memory"].arena is arena and stores["disk"].arena is None
    for mode, store in stores.items():
        store.put("w", np.ones(3, np.float32))
        store.zeros("sum", (5,))
        store.recycle("sum")
        store.recycle("never there")
        assert ("sum" in store) == (mode == "memory"), mode  # kept in RAM; its file freed on disk
        with caplog.at_level(logging.INFO, logger="weightstream.memoryx"):
            store.log_io(4)
        store.close()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["step 4 applied"]  # the disk's


def test_sum_of_squares_read_in_blocks_from_disk_is_bitwise_the_whole_arrays(tmp_path: Path, rng) -> None:
    g = rng.standard_normal(2 * store_module.BLOCK_ELEMENTS + 17).astype(np.float32)
    disk = DiskStore(tmp_path / "d")
    disk.put("g", g)
    total = 0.0
    for block in disk.blocks("g"):  # three reads of up to BLOCK_ELEMENTS
        total = add_sq_sum(total, block)
    assert total == grad_sq_sum(g)  # what a shard holding g in RAM computes
    assert SUM_BLOCK < store_module.BLOCK_ELEMENTS and store_module.BLOCK_ELEMENTS % SUM_BLOCK == 0
    disk.close()


def _tiny_job(tmp_path: Path, **runconfig: object) -> JobSpec:
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(model_dir=str(tmp_path / "model"), **runconfig)
    params = load_params(raw)
    plan = make_plan(params)
    return JobSpec(params.model_dump(mode="json"), plan.to_dict(), {}, "memoryx", 0)


def test_the_role_builds_its_shard_on_disk_when_the_params_say_so(tmp_path: Path) -> None:
    """memoryx_storage: disk reaches the shard, not only the params validation."""
    shard = memoryx_service.build(_tiny_job(tmp_path, memoryx_storage="disk"))
    where = tmp_path / "model" / ".memoryx" / "shard_0"
    assert isinstance(shard.store, DiskStore) and shard.store.directory == where
    w = "transformer.h.0.mlp.c_fc.weight"
    assert (where / f"{w}.f32").stat().st_size == 4 * int(np.prod(shard.model.specs[w].shape))
    assert {p.name for p in where.iterdir()} >= {f"{w}.f32", f"{w}.exp_avg.f32", f"{w}.exp_avg_sq.f32"}
    shard.close()
    other = memoryx_service.build(_tiny_job(tmp_path, memoryx_storage="disk", memoryx_dir="scratch"))
    assert isinstance(other.store, DiskStore)
    assert other.store.directory == tmp_path / "model" / "scratch" / "shard_0"
    other.close()
    assert isinstance(memoryx_service.build(_tiny_job(tmp_path)).store, MemoryStore)


def test_a_disk_shard_holds_little_of_its_model_in_memory(tmp_path: Path) -> None:
    """~25M parameters (100 MB of weights, 200 MB of Adam state): building the shard, summing and applying
    a step's gradients on disk leave the process's resident memory far below the model's size; in memory
    mode it grows by all of it. Resident memory is measured, not timed."""
    raw = json.loads(json.dumps(TINY))
    raw["model"].update(hidden_size=512, num_hidden_layers=8, num_heads=8, filter_size=2048, vocab_size=64)
    params = load_params(raw)
    model, opt = model_def(params), optimizer_config(params.optimizer)
    state_bytes = 3 * 4 * sum(int(np.prod(s.shape)) for s in model.specs.values())
    assert state_bytes > 250e6
    me = psutil.Process()
    grown = {}
    for mode, where in (("disk", tmp_path / "mx"), ("memory", None)):
        before = me.memory_info().rss
        shard = MemoryXShard(model, opt, list(model.specs), seed=1, timeout_s=30, storage_dir=where)
        peak = me.memory_info().rss
        for u, unit in enumerate(model.units):  # one unit's gradient at a time, as pushes arrive
            grads = {n: np.ones(model.specs[n].shape, np.float32) for n in unit.param_names}
            shard.add_gradient(0, u, grads)
            del grads
            peak = max(peak, me.memory_info().rss)
        assert shard.apply_update(0, lr=1e-3, clip_coef=1.0)  # writes every Adam buffer
        grown[mode] = max(peak, me.memory_info().rss) - before
        shard.close()
    assert grown["memory"] > 0.9 * state_bytes
    largest_unit = max(
        sum(4 * int(np.prod(model.specs[n].shape)) for n in u.param_names) for u in model.units
    )
    assert grown["disk"] < 2 * largest_unit + 64e6, (grown, largest_unit)


def test_checkpoint_files_split_at_max_shard_size_across_memoryx_shards() -> None:
    shards = [[("a", 40), ("b", 40), ("c", 100)], [("d", 10), ("e", 10)]]
    assert checkpoint_files("model", shards, 80) == [
        [("model-00001-of-00003.safetensors", ["a", "b"]), ("model-00002-of-00003.safetensors", ["c"])],
        [("model-00003-of-00003.safetensors", ["d", "e"])],
    ]
    assert checkpoint_files("optimizer", [[("a", 5)]], 80) == [[("optimizer.safetensors", ["a"])]]


def test_streamed_safetensors_load_in_the_library_and_round_trip(tmp_path: Path, rng) -> None:
    tensors = {
        "x.weight": rng.standard_normal((33, 5)).astype(np.float32),
        "y": np.arange(7, dtype=np.float32),
    }
    store = DiskStore(tmp_path / "s")
    for k, v in tensors.items():
        store.put(k, v)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, [(k, v.shape, partial(store.blocks, k)) for k, v in tensors.items()])
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors) and all(np.array_equal(loaded[k], v) for k, v in tensors.items())
    assert dict(iter_tensors(tmp_path, "model", ["y"]))["y"].tolist() == list(range(7))

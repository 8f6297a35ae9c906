"""bench/beyond_ram.py: what it reads from a run (the shards' I/O log lines, disk use) and its params."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.bench_module import load_bench
from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.memoryx.store import DiskStore
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.size import num_params


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("beyond_ram")


def test_memoryx_io_reads_what_a_disk_shard_logs(
    bench: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The per-step I/O seconds come from the shard's own log lines: the bench must parse their format."""
    p = load_params(json.loads(json.dumps(TINY)))
    model = model_def(p)
    shard = MemoryXShard(
        model, optimizer_config(p.optimizer), list(model.specs), 1, 5, storage_dir=tmp_path / "mx"
    )
    with caplog.at_level(logging.INFO, logger="weightstream.memoryx"):
        for step in range(2):
            for u, unit in enumerate(model.units):
                shard.add_gradient(
                    step, u, {n: np.ones(model.specs[n].shape, np.float32) for n in unit.param_names}
                )
            shard.apply_update(step, lr=1e-3, clip_coef=1.0)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "memoryx-0.log").write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    (logs / "memoryx-1.log").write_text((logs / "memoryx-0.log").read_text())
    per_step = bench.memoryx_io(logs)
    assert sorted(per_step) == [1, 2] and all(v >= 0 for v in per_step.values())
    assert isinstance(shard.store, DiskStore)
    assert sum(per_step.values()) == pytest.approx(2 * shard.store.io_seconds, rel=1e-3, abs=2e-3)
    shard.close()


def test_disk_use_counts_allocated_blocks_not_sizes(bench: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "dense").write_bytes(b"x" * 1_000_000)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(50_000_000)
    assert 1_000_000 <= bench.disk_use(tmp_path) < 1_200_000


def test_the_default_model_has_2_45b_parameters_and_exceeds_this_machines_ram(
    bench: ModuleType, tmp_path: Path
) -> None:
    a = argparse.Namespace(
        hidden=4096, layers=12, heads=32, vocab=8192, batch=2, seq=64, steps=3, lr=1e-6, shards=2
    )
    raw = bench.params_dict(a, tmp_path)
    p = load_params(raw)
    n = num_params(p.model)
    assert 2.4e9 < n < 2.5e9 and 12 * n > 25e9  # fp32 weights + Adam: ~27 GiB
    rc = p.runconfig
    assert (rc.memoryx_storage, rc.checkpoint_optimizer_state, rc.recovery_snapshot_steps) == (
        "disk",
        False,
        0,
    )
    assert p.optimizer.max_gradient_norm is None

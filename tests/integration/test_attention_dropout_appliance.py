"""Attention dropout through the appliance: its masks depend on (seed, step, global sample, layer) only, so
one and two CS-2 workers, with micro-batches and forwards recomputed in backward (which draw the masks
again), follow the in-process reference step for step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from numpy.testing import assert_allclose

from tests.integration.appliance import LOSS_RTOL, run, write_params
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer

STEPS = 3
_MEMORY_LOG = re.compile(r"micro-batch (\d+), (\d+) unit forward passes recomputed in backward")


def _rows(model_dir: Path) -> dict[int, dict]:
    lines = (model_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


@pytest.mark.slow  # ~11 s: kept out of the default suite's time; the unit tests stay in it
def test_one_and_two_workers_with_recompute_follow_the_reference(tmp_path: Path) -> None:
    p = write_params(tmp_path, max_steps=STEPS, worker_memory_mb=1)  # 1 MiB: micro-batches and recompute
    raw = yaml.safe_load(p.read_text())
    raw["model"].update(
        hidden_size=64, filter_size=256, attention_dropout_rate=0.2
    )  # test_dropout_appliance's
    raw["train_input"]["batch_size"] = 32
    p.write_text(yaml.safe_dump(raw))
    reference = ReferenceTrainer(load_params(p), num_shards=1)  # one shard: other sample offsets
    want = [reference.train_step() for _ in range(STEPS)]
    raw["model"]["attention_dropout_rate"] = 0.0
    plain = ReferenceTrainer(load_params(raw), num_shards=1)
    assert abs(plain.train_step().grad_norm - want[0].grad_norm) > 1e-3  # the dropout is on
    for n in (1, 2):
        model_dir = tmp_path / f"csx{n}"
        r = run(p, model_dir, "--num_csx", str(n))
        assert r.returncode == 0, r.stderr
        micro, recomputed = (
            int(v) for v in _MEMORY_LOG.findall((model_dir / "logs" / "worker-0.log").read_text())[0]
        )
        assert micro < 32 // n and recomputed > 0  # masks drawn again in backward, for pieces of shards
        rows = _rows(model_dir)
        for s in want:
            assert_allclose(
                rows[s.step]["loss"], s.loss, rtol=LOSS_RTOL, err_msg=f"{n} workers, step {s.step}"
            )
            assert_allclose(rows[s.step]["grad_norm"], s.grad_norm, rtol=1e-5, err_msg=f"{n}, step {s.step}")
    config = json.loads((tmp_path / "csx2" / f"checkpoint_{STEPS}" / "config.json").read_text())
    assert config["attn_pdrop"] == 0.2  # what Hugging Face trains on with

"""GPT-2 dropout through the appliance: masks depend on (seed, step, global sample, site) only, so a run
with dropout equals the in-process reference whatever the workers, micro-batches or recomputation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from numpy.testing import assert_allclose

from tests.integration.appliance import LOSS_RTOL, metrics, run, write_params
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer

_MEMORY_LOG = re.compile(r"micro-batch (\d+), (\d+) unit forward passes recomputed in backward")


def _params(tmp: Path, dropout: float, **extra: int) -> Path:
    """test_appliance's recompute GPT-2 (two workers, shards of 16) with dropout on residuals and
    embeddings. ``extra``: ``worker_memory_mb`` (runconfig) or ``micro_batch_size`` (train_input)."""
    tmp.mkdir(exist_ok=True)
    runconfig = {k: v for k, v in extra.items() if k != "micro_batch_size"}
    p = write_params(tmp, max_steps=3, num_csx=2, **runconfig)
    raw = yaml.safe_load(p.read_text())
    raw["model"].update(hidden_size=64, filter_size=256, dropout_rate=dropout, embedding_dropout_rate=dropout)
    raw["train_input"]["batch_size"] = 32
    if "micro_batch_size" in extra:
        raw["train_input"]["micro_batch_size"] = extra["micro_batch_size"]
    p.write_text(yaml.safe_dump(raw))
    return p


def _rows(model_dir: Path) -> dict[int, dict]:
    lines = (model_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "loss" in r}


@pytest.mark.slow  # ~12-14 s: the default suite stays under ~9 minutes
def test_dropout_run_equals_the_reference_with_micro_batches_and_recompute(tmp_path: Path) -> None:
    params_path = _params(tmp_path / "p_budget", 0.2, worker_memory_mb=1)
    budget = tmp_path / "budget"
    r = run(params_path, budget)
    assert r.returncode == 0, r.stderr
    micro, recomputed = (
        int(v) for v in _MEMORY_LOG.findall((budget / "logs" / "worker-1.log").read_text())[0]
    )
    assert micro < 16 and recomputed > 0  # masks are drawn again in backward, and must be the same

    trainer = ReferenceTrainer(load_params(params_path), num_shards=1)  # one shard: other sample offsets
    rows = _rows(budget)
    for s in (trainer.train_step() for _ in range(3)):
        assert_allclose(rows[s.step]["loss"], s.loss, rtol=LOSS_RTOL, err_msg=f"loss, step {s.step}")
        assert_allclose(rows[s.step]["grad_norm"], s.grad_norm, rtol=1e-6, err_msg=f"|g|, step {s.step}")

    kept = tmp_path / "kept"  # the same micro-batches, nothing recomputed: not a bit differs
    assert run(_params(tmp_path / "p_kept", 0.2, micro_batch_size=micro), kept).returncode == 0
    assert metrics(kept)[0] == metrics(budget)[0]

    plain = tmp_path / "plain"  # and dropout is really on: without it the same run trains otherwise
    assert run(_params(tmp_path / "p_plain", 0.0, micro_batch_size=micro), plain).returncode == 0
    assert abs(metrics(plain)[0][1] - metrics(kept)[0][1]) > 1e-3
    config = json.loads((kept / "checkpoint_3" / "config.json").read_text())
    assert (config["resid_pdrop"], config["embd_pdrop"]) == (0.2, 0.2)  # what Hugging Face trains on with

"""``loss_scaling: batch_size`` through the appliance: two CS-2 workers on padded HDF5 data log ModelZoo's
loss, derived from the num_tokens loss of the same first batch.

ModelZoo's batch_size loss is sum(token losses) / B * loss_weight, its num_tokens loss sum / counted. With
loss_weight = 1/T the first is the second times counted / (B * T): below 1 exactly where there is padding,
and so is the gradient (the first step's gradient norm too, before clipping).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from numpy.testing import assert_allclose

from tests.integration.appliance import LOSS_RTOL, run
from tests.params_files import padded_hdf5_params
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer


def test_batch_size_scaling_on_two_workers_logs_modelzoos_loss(tmp_path: Path) -> None:
    raw = padded_hdf5_params(tmp_path)  # TINY: B 8, T 16, vocab 64, two HDF5 files with padding
    raw["runconfig"].update(max_steps=2)
    b, t = raw["train_input"]["batch_size"], raw["train_input"]["max_sequence_length"]
    plain = ReferenceTrainer(load_params(raw), num_shards=1).train_step()  # num_tokens: the mean
    assert plain.tokens < b * t  # padding: the two scalings differ
    raw["model"].update(loss_scaling="batch_size", loss_weight=1 / t)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    r = run(params, tmp_path / "run", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = {row["step"]: row for row in map(json.loads, lines) if "loss" in row}
    ratio = plain.tokens / (b * t)
    assert_allclose(rows[1]["loss"], plain.loss * ratio, rtol=LOSS_RTOL)
    assert_allclose(rows[1]["grad_norm"], plain.grad_norm * ratio, rtol=1e-5)
    reference = ReferenceTrainer(load_params(params), num_shards=1)  # and step 2 follows the reference
    for step in (reference.train_step() for _ in range(2)):
        assert_allclose(rows[step.step]["loss"], step.loss, rtol=LOSS_RTOL, err_msg=f"step {step.step}")

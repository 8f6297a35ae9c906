"""The next step's forward overlaps the current step's update (training/stepping.py, memoryx/update.py)
without changing a bit: at num_csx 1 with one MemoryX shard the appliance sums and updates in exactly the
reference trainer's order, which has no overlap, so its losses and weights are the reference's bit for
bit."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.integration.appliance import metrics, run, write_params
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer


@pytest.mark.parametrize(
    ("eval_frequency", "checkpoint_steps", "overlapped"),
    [(0, 0, 7), (3, 4, 4)],  # after steps 3, 4, 6 and 8 come an evaluation or a checkpoint: no overlap
)
def test_overlapped_updates_give_the_references_bits(
    tmp_path: Path, eval_frequency: int, checkpoint_steps: int, overlapped: int
) -> None:
    path = write_params(
        tmp_path, num_wgt_servers=1, eval_frequency=eval_frequency, checkpoint_steps=checkpoint_steps
    )
    params = load_params(path)
    reference = ReferenceTrainer(params, num_shards=1)
    ref_losses = {}
    for _ in range(params.runconfig.max_steps):
        r = reference.train_step()
        ref_losses[r.step] = r.loss
    done = run(path, tmp_path / "m", "--num_csx", "1")
    assert done.returncode == 0, done.stderr
    losses, _ = metrics(tmp_path / "m")
    assert losses == ref_losses  # exactly
    weights: dict[str, np.ndarray] = {}
    for f in (tmp_path / "m" / "checkpoint_8").glob("model*.safetensors"):
        weights |= load_file(str(f))
    for name, w in reference.weights.items():
        assert np.array_equal(weights[name], w), name
    # and the overlap did happen, wherever the next action was a step (never before an evaluation or a
    # checkpoint, which need the step's update whole and no step running)
    log = (tmp_path / "m" / "run.log").read_text()
    found = re.search(r"(\d+) steps started while the previous step's update was being applied", log)
    assert found is not None and int(found.group(1)) == overlapped

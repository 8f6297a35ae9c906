"""A diverging run stops at the step whose loss or gradient norm is not finite, before its update."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.training.divergence import TrainingDiverged, check_finite
from weightstream.training.reference import ReferenceTrainer

# SGD at learning rate 1e6 without clipping: step 2's update overflows, step 3's gradient norm is NaN
DIVERGING = copy.deepcopy(TINY)
DIVERGING["optimizer"] = {"optimizer_type": "sgd", "learning_rate": 1.0e6}
DIVERGING["model"] = {**DIVERGING["model"], "nonlinearity": "gelu_new"}  # the tanh form: non-finite at step 3


def test_check_finite_names_the_step_and_each_quantity() -> None:
    check_finite(3, loss=1.5, gradient_norm=0.0)
    with pytest.raises(TrainingDiverged, match=r"step 7: the loss is nan, the gradient norm is inf"):
        check_finite(7, loss=math.nan, gradient_norm=math.inf)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings are the point here
def test_reference_trainer_stops_before_applying_a_non_finite_step() -> None:
    trainer = ReferenceTrainer(load_params(DIVERGING))
    trainer.train_step()
    trainer.train_step()
    before = {n: w.copy() for n, w in trainer.weights.items()}
    with pytest.raises(TrainingDiverged, match="step 3"):
        trainer.train_step()
    assert trainer.step == 2  # the step was not counted, and its update was not applied
    for n, w in trainer.weights.items():
        assert np.array_equal(w, before[n]) and np.isfinite(w).all(), n


def test_memoryx_refuses_to_checkpoint_non_finite_tensors(tmp_path: Path) -> None:
    p = load_params(TINY)
    model = model_def(p)
    shard = MemoryXShard(model, optimizer_config(p.optimizer), list(model.specs), seed=7, timeout_s=2)
    names = list(model.specs)
    shard.write_checkpoint(0, [(tmp_path / "model.safetensors", names)], [])  # finite: fine
    assert (tmp_path / "model.safetensors").is_file()
    shard.weight("transformer.h.1.mlp.c_fc.bias")[3] = np.inf  # memory mode: the live array
    shard.weight("transformer.ln_f.bias")[0] = np.nan
    bad = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match=r"non-finite values in transformer\.h\.1\.mlp\.c_fc\.bias, .*ln_f"):
        shard.write_checkpoint(0, [(bad, names)], [])
    assert not bad.exists() and not (tmp_path / "bad.safetensors.partial").exists()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_eval_loss_stops_the_reference_trainer() -> None:
    trainer = ReferenceTrainer(load_params(TINY))
    trainer.train_step()
    assert math.isfinite(trainer.evaluate())
    trainer.weights["transformer.ln_f.bias"][:] = np.nan
    with pytest.raises(TrainingDiverged, match=r"step 1: the eval loss is nan"):
        trainer.evaluate()


def test_divergence_is_a_job_failure() -> None:
    """The service and the console treat a diverged run as failed, with its message."""
    from weightstream.training.errors import JobFailed

    assert issubclass(TrainingDiverged, JobFailed)

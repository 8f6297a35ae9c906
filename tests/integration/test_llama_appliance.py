"""The LLaMA family through the appliance, as a user runs it: `weightstream run --num_csx 2` on byte-level
text learns, equals the in-process reference at any node count, and its checkpoint loads in Hugging Face
as ``LlamaForCausalLM`` with the eval loss weightstream reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file

from tests.integration.appliance import LOSS_RTOL, metrics, run, transformers_loss, write_llama_params
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer


# ~12 s; LLaMA on one and four workers stays in the default run
@pytest.mark.slow
def test_llama_learns_on_two_workers_and_loads_in_hugging_face(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    params_path = write_llama_params(tmp_path)
    r = run(params_path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, evals = metrics(tmp_path / "m")
    assert losses[120] < 0.6 * losses[1]
    assert evals[120] < 0.6 * np.log(256), evals  # held-out loss well below uniform (ln 256 = 5.55)

    ckpt = tmp_path / "m" / "checkpoint_120"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    trainer = ReferenceTrainer(load_params(params_path))
    assert trainer.eval_data is not None
    hf = transformers_loss(ckpt, [trainer.eval_data.global_batch(b) for b in range(4)])
    assert_allclose(hf, evals[120], rtol=0.05)  # the bar for agreeing with Hugging Face; in fact ~1e-6
    assert_allclose(hf, evals[120], rtol=1e-4)


@pytest.mark.slow  # ~14 s; the default run keeps Llama's numerics (unit) and GPT-2's node-count checks
def test_llama_equals_the_reference_at_one_and_four_workers(tmp_path: Path) -> None:
    params_path = write_llama_params(tmp_path, max_steps=6)
    trainer = ReferenceTrainer(load_params(params_path), num_shards=1)
    ref = {}
    for _ in range(6):
        result = trainer.train_step()
        ref[result.step] = result.loss
    for n in ("1", "4"):
        r = run(params_path, tmp_path / f"m{n}", "--num_csx", n)
        assert r.returncode == 0, r.stderr
        losses, _ = metrics(tmp_path / f"m{n}")
        for step, loss in ref.items():
            assert_allclose(losses[step], loss, rtol=LOSS_RTOL, err_msg=f"step {step}, num_csx={n}")


# gmp: 0.5 at the start, rising towards 0.9 (0.897 at the last update, step 10), masks made every 2 steps
GMP = {
    "algorithm": "gmp",
    "init_method": "balanced-topk",
    "sparsity": {"type": "exp", "init": 0.5, "gamma": -0.5, "final": 0.9},
    "update": {"freq": 2},
}


@pytest.mark.parametrize(
    "sparsity",
    [
        pytest.param({"sparsity": 0.9, "init_method": "balanced-topk"}, id="static"),
        pytest.param(GMP, id="gmp"),
    ],
)
def test_sparse_llama_equals_the_reference_and_loads_in_hugging_face(
    tmp_path: Path, sparsity: dict[str, Any]
) -> None:
    """90% sparse (balanced-topk) q/k/v/o/gate/up/down on two workers, or pruned to it by gmp: the
    reference's loss curve and masks, pruned weights zero in the checkpoint, and LlamaForCausalLM computes
    weightstream's eval loss from it."""
    pytest.importorskip("torch", reason="pip install -e .[test]")
    pytest.importorskip("transformers", reason="pip install -e .[test]")
    params_path = write_llama_params(tmp_path, max_steps=10)
    raw = yaml.safe_load(params_path.read_text())
    raw["sparsity"] = sparsity
    params_path.write_text(yaml.safe_dump(raw))
    r = run(params_path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, evals = metrics(tmp_path / "m")
    params = load_params(params_path)
    trainer = ReferenceTrainer(params, num_shards=2)
    for step in range(1, 11):
        assert_allclose(losses[step], trainer.train_step().loss, rtol=LOSS_RTOL, err_msg=f"step {step}")
    assert losses[10] < losses[1]
    ckpt = tmp_path / "m" / "checkpoint_10"
    weights = {k: v for f in ckpt.glob("model*.safetensors") for k, v in load_file(f).items()}
    masks = {k: v for f in ckpt.glob("sparsity_masks*.safetensors") for k, v in load_file(f).items()}
    assert len(masks) == 2 * 7  # q, k, v, o, gate, up, down of both layers
    for n, mask in masks.items():
        assert not weights[n][~mask].any(), n
        assert np.array_equal(mask, trainer.masks[n] > 0), n  # the reference's masks, exactly
        if "algorithm" not in sparsity:  # balanced: every row keeps as many (gmp's updates rank globally)
            assert (mask.sum(axis=1) == mask[0].sum()).all(), n
        else:  # the level at step 10: 0.9 - 0.4 exp(-5) = 0.8973
            assert 0.1 < mask.mean() < 0.105, n
    assert trainer.eval_data is not None
    hf = transformers_loss(ckpt, [trainer.eval_data.global_batch(b) for b in range(4)])
    assert_allclose(hf, evals[10], rtol=1e-4)

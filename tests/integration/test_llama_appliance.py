"""The LLaMA family through the appliance, as a user runs it: `weightstream run --num_csx 2` on byte-level
text learns, equals the in-process reference at any node count, and its checkpoint loads in Hugging Face
as ``LlamaForCausalLM`` with the eval loss weightstream reported."""

from __future__ import annotations

import json
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file

from tests.integration.appliance import metrics, run, transformers_loss
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer

LOSS_RTOL = 2e-5  # float32 rounding between reduction orders (see test_appliance.py)


def _llama(tmp: Path, **runconfig: Any) -> Path:
    """rotary, RMSNorm, SwiGLU, 2 kv groups of 4 heads, no biases, untied embeddings, byte-level text: the
    Python documentation's topics that ship with Python (pydoc_data; English that does not change from one
    commit of ours to the next), 40 to train on, the next 10 held out."""
    names = sorted(topics)
    for split, part in (("train", names[:40]), ("eval", names[40:50])):
        text = "\n\n".join(topics[n] for n in part).encode("utf-8")
        (tmp / split).mkdir(exist_ok=True)
        (tmp / split / "part.txt").write_bytes(text)
    params = {
        "train_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(tmp / "train"),
            "batch_size": 8,
            "max_sequence_length": 32,
            "shuffle_seed": 1,
        },
        "eval_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(tmp / "eval"),
            "batch_size": 8,
            "max_sequence_length": 32,
        },
        "model": {
            "name": "llama",
            "vocab_size": 256,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_heads": 4,
            "filter_size": 172,
            "max_position_embeddings": 64,
            "position_embedding_type": "rotary",
            "rope_theta": 10000.0,
            "norm_type": "rmsnorm",
            "nonlinearity": "swiglu",
            "attention_module": "multiquery_attention",
            "extra_attention_params": {"num_kv_groups": 2},
            "use_ffn_bias": False,
            "use_projection_bias_in_attention": False,
            "use_ffn_bias_in_attention": False,
            "share_embedding_weights": False,
        },
        "optimizer": {
            "optimizer_type": "adamw",
            "betas": [0.9, 0.95],
            "weight_decay": 0.1,
            "max_gradient_norm": 1.0,
            "learning_rate": [
                {
                    "scheduler": "Linear",
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 1e-2,
                    "total_iters": 5,
                },
                {
                    "scheduler": "CosineDecay",
                    "initial_learning_rate": 1e-2,
                    "end_learning_rate": 1e-3,
                    "total_iters": 115,
                },
            ],
        },
        "runconfig": {
            "max_steps": 120,
            "log_steps": 1,
            "eval_steps": 4,
            "seed": 3,
            "num_wgt_servers": 2,
            **runconfig,
        },
    }
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


# ~12 s; LLaMA on one and four workers stays in the default run
@pytest.mark.slow
def test_llama_learns_on_two_workers_and_loads_in_hugging_face(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    params_path = _llama(tmp_path)
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


def test_llama_equals_the_reference_at_one_and_four_workers(tmp_path: Path) -> None:
    params_path = _llama(tmp_path, max_steps=6)
    trainer = ReferenceTrainer(load_params(params_path), num_shards=1)
    ref = {}
    for _ in range(6):
        step = trainer.train_step()
        ref[step.step] = step.loss
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
    params_path = _llama(tmp_path, max_steps=10)
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

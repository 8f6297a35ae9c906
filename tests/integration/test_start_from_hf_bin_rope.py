"""Two starting points through `weightstream run --num_csx 2`: a GPT-2 saved as pytorch_model.bin (read with
torch), and a LLaMA with Llama 3.1's RoPE scaling, whose first loss and whose own step-0 checkpoint must
both be transformers' loss of the same model."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file

from tests.integration.appliance import TINY, metrics, run, transformers_loss, write_llama_params
from weightstream.data import make_data_processor
from weightstream.params import load_params
from weightstream.params.schema import LlamaModelParams

torch = pytest.importorskip("torch", reason="pip install -e .[test]")
transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")


def _first_batch_loss(model_dir: Path, params: Path) -> float:
    """transformers' loss of ``model_dir`` on the first training batch (what step 1 reports)."""
    p = load_params(params)
    return transformers_loss(
        model_dir, [make_data_processor(p.train_input, p.model, "train").global_batch(0)]
    )


def _tensors(checkpoint: Path) -> dict[str, np.ndarray]:
    return {k: v for f in sorted(checkpoint.glob("model*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow  # ~10 s: in .ci/run's slow phase, keeping the default suite short
def test_gpt2_from_pytorch_model_bin_at_two_workers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    shape = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 64}
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0))
    binary = tmp_path / "hf-bin"
    hf.config.save_pretrained(binary)  # as transformers 4's save_pretrained(safe_serialization=False)
    torch.save(hf.state_dict(), binary / "pytorch_model.bin")
    p = copy.deepcopy(TINY)
    p["model"]["nonlinearity"] = "gelu_new"  # GPT2Config's default
    p["runconfig"] |= {"max_steps": 1, "num_csx": 2, "save_initial_checkpoint": True}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(p))
    r = run(params, tmp_path / "m", "--checkpoint_path", str(binary))
    assert r.returncode == 0, r.stderr
    start = _tensors(tmp_path / "m" / "checkpoint_0")
    theirs = {k: v.numpy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied to wte
    assert start.keys() == theirs.keys()
    for k, v in start.items():
        assert np.array_equal(v, theirs[k]), k
    twin = tmp_path / "hf-safetensors"
    hf.save_pretrained(twin)
    assert_allclose(metrics(tmp_path / "m")[0][1], _first_batch_loss(twin, params), rtol=1e-5)


LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.slow  # ~10 s: in .ci/run's slow phase, keeping the default suite short
def test_llama_with_llama3_rope_scaling_starts_and_exports_with_transformers_loss(tmp_path: Path) -> None:
    params = write_llama_params(tmp_path, max_steps=1, save_initial_checkpoint=True)
    p = yaml.safe_load(params.read_text())
    p["model"] |= {
        "pos_scaling_type": "llama3",
        "pos_scaling_factor": LLAMA3["factor"],
        "pos_scaling_extra_args": {k: v for k, v in LLAMA3.items() if k != "factor"},
    }
    params.write_text(yaml.safe_dump(p))
    m = load_params(params).model
    assert isinstance(m, LlamaModelParams)
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=m.layer_norm_epsilon,
        rope_parameters={"rope_type": "llama3", **LLAMA3, "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # attention that depends on position, so the scaling shows in the loss
        for name, w in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                w.mul_(25.0)
    hf = tmp_path / "hf-llama"
    model.save_pretrained(hf)
    unscaled = tmp_path / "hf-llama-unscaled"  # the same weights read without the scaling
    shutil.copytree(hf, unscaled)
    config = json.loads((unscaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (unscaled / "config.json").write_text(json.dumps(config))

    r = run(params, tmp_path / "m", "--num_csx", "2", "--checkpoint_path", str(hf))
    assert r.returncode == 0, r.stderr
    ours = metrics(tmp_path / "m")[0][1]
    theirs = _first_batch_loss(hf, params)
    assert_allclose(ours, theirs, rtol=1e-5)
    assert abs(_first_batch_loss(unscaled, params) - theirs) > 1e-3 * theirs, "the scaling must matter here"
    # our own checkpoint's config.json carries the scaling: transformers computes the same loss from it
    assert_allclose(_first_batch_loss(tmp_path / "m" / "checkpoint_0", params), theirs, rtol=1e-5)

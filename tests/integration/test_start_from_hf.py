"""Training starts from a Hugging Face model made and saved by transformers in the test: the three ways
of naming it, bitwise-equal step-0 checkpoints, transformers' own first-step loss, checks against the
params, and a run's own checkpoint winning over the starting point."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file, save_file

from tests.integration.appliance import (
    TINY,
    metrics,
    run,
    transformers_loss,
    weightstream_cmd,
    write_llama_params,
)
from weightstream.data import make_data_processor
from weightstream.params import load_params
from weightstream.params.schema import LlamaModelParams

torch = pytest.importorskip("torch", reason="pip install -e .[test]")
transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")


def _gpt2(tmp: Path, **config: Any) -> Path:
    """A GPT2LMHeadModel of TINY's shape, random weights of transformers' own init, saved as HF does."""
    torch.manual_seed(0)
    shape = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 64}
    cfg = transformers.GPT2Config(**(shape | config), bos_token_id=0, eos_token_id=0)
    path = tmp / "hf-gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def _params(tmp: Path, **runconfig: Any) -> Path:
    p = copy.deepcopy(TINY)
    p["model"]["nonlinearity"] = "gelu_new"  # transformers' GPT2Config default: the tanh form
    p["runconfig"] |= {"max_steps": 3, "num_csx": 2, "save_initial_checkpoint": True, **runconfig}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _tensors(checkpoint: Path) -> dict[str, np.ndarray]:
    return {k: v for f in sorted(checkpoint.glob("model*.safetensors")) for k, v in load_file(f).items()}


def _hf_loss(model_dir: Path, params_path: Path) -> float:
    """transformers' loss of ``model_dir`` on the first training batch (what step 1 reports)."""
    p = load_params(params_path)
    return transformers_loss(
        model_dir, [make_data_processor(p.train_input, p.model, "train").global_batch(0)]
    )


# ~10 s; starting from a Hugging Face directory by flag stays in the default run
@pytest.mark.slow
def test_gpt2_from_runconfig_checkpoint_path_starts_bitwise_from_its_tensors(tmp_path: Path) -> None:
    hf = _gpt2(tmp_path)
    params = _params(tmp_path, checkpoint_path=str(hf))
    r = run(params, tmp_path / "m")
    assert r.returncode == 0, r.stderr
    start = _tensors(tmp_path / "m" / "checkpoint_0")
    theirs = load_file(hf / "model.safetensors")
    assert start.keys() == {k for k in theirs if k != "lm_head.weight"}  # tied: the head is wte
    for k, v in start.items():
        assert np.array_equal(v, theirs[k]), k
    losses, _ = metrics(tmp_path / "m")
    assert_allclose(losses[1], _hf_loss(hf, params), rtol=1e-5)  # weightstream's step 1 is transformers' loss
    assert "starting from" in (tmp_path / "m" / "run.log").read_text()
    # the run's own checkpoint wins over the starting point: a longer rerun resumes at step 3
    longer = _params(tmp_path, checkpoint_path=str(hf), max_steps=4)
    r = run(longer, tmp_path / "m")
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stderr
    assert sorted(metrics(tmp_path / "m")[0]) == [1, 2, 3, 4]


def test_gpt2_from_trainer_fit_ckpt_path(tmp_path: Path) -> None:
    """The trainer: layout's name for the starting point, with LoadCheckpointStates as ModelZoo writes it."""
    from weightstream.params.convert import to_trainer

    hf = _gpt2(tmp_path)
    trainer, _ = to_trainer(yaml.safe_load(_params(tmp_path).read_text()))
    trainer["trainer"]["fit"]["ckpt_path"] = str(hf)
    trainer["trainer"]["init"]["callbacks"] = [{"LoadCheckpointStates": {"load_checkpoint_states": "model"}}]
    params = tmp_path / "trainer.yaml"
    params.write_text(yaml.safe_dump(trainer))
    r = run(params, tmp_path / "m", "--max_steps", "1")
    assert r.returncode == 0, r.stderr
    start, theirs = _tensors(tmp_path / "m" / "checkpoint_0"), load_file(hf / "model.safetensors")
    assert start and all(np.array_equal(v, theirs[k]) for k, v in start.items())
    assert_allclose(metrics(tmp_path / "m")[0][1], _hf_loss(hf, params), rtol=1e-5)


def test_llama_from_the_command_line_flag_at_two_workers(tmp_path: Path) -> None:
    params = write_llama_params(tmp_path, max_steps=2, save_initial_checkpoint=True)
    p = load_params(params)
    assert isinstance(p.model, LlamaModelParams)
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=p.model.layer_norm_epsilon,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    hf = tmp_path / "hf-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(hf, max_shard_size="100KB")  # sharded, with an index
    assert (hf / "model.safetensors.index.json").is_file()
    r = run(params, tmp_path / "m", "--num_csx", "2", "--checkpoint_path", str(hf))
    assert r.returncode == 0, r.stderr
    start = _tensors(tmp_path / "m" / "checkpoint_0")
    theirs = {k: v for f in hf.glob("model-*.safetensors") for k, v in load_file(f).items()}
    assert start.keys() == theirs.keys()
    for k, v in start.items():
        assert np.array_equal(v, theirs[k]), k
    losses, _ = metrics(tmp_path / "m")
    assert_allclose(losses[1], _hf_loss(hf, params), rtol=1e-5)


def test_a_mismatched_or_unreadable_checkpoint_is_refused_naming_what_differs(tmp_path: Path) -> None:
    hf = _gpt2(tmp_path, n_head=2, layer_norm_epsilon=1e-6)
    params = _params(tmp_path)
    cmd = [*weightstream_cmd(), "validate", str(params), "--checkpoint_path", str(hf)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2
    assert "n_head = 2, the params give 4" in r.stderr and "layer_norm_epsilon" in r.stderr
    exact = yaml.safe_load(params.read_text())
    exact["model"]["nonlinearity"] = "gelu"  # ModelZoo's gelu is the erf form, not the checkpoint's tanh
    params.write_text(yaml.safe_dump(exact))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert "activation_function = 'gelu_new', the params give 'gelu'" in r.stderr
    params = _params(tmp_path)
    # the run fails before a single role starts, with the same reasons
    r = run(params, tmp_path / "m", "--checkpoint_path", str(hf))
    assert r.returncode != 0 and "n_head = 2" in r.stderr and not (tmp_path / "m" / "logs").exists()
    other = tmp_path / "bigger"
    shutil.copytree(hf, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "n_head": 4, "layer_norm_epsilon": 1e-5}))
    tensors = load_file(other / "model.safetensors")
    tensors["transformer.wpe.weight"] = np.zeros((32, 32), np.float32)  # 32 positions, the params say 16
    tensors["transformer.h.9.ln_1.weight"] = np.ones(32, np.float32)  # a layer this model does not have
    save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
    r = subprocess.run([*cmd[:-1], str(other)], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2
    assert "transformer.wpe.weight: shape [32, 32] in the checkpoint, [16, 32] in the params" in r.stderr
    assert "does not have: transformer.h.9.ln_1.weight" in r.stderr
    (other / "model.safetensors").rename(other / "pytorch_model.bin")
    r = subprocess.run([*cmd[:-1], str(other)], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "pytorch_model" in r.stderr and "save_pretrained" in r.stderr

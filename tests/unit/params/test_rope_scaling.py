"""RoPE scaling in params files, config.json and a starting checkpoint: the keys reach the model, errors name
them, exports load in transformers with the same frequencies, and a checkpoint must match the params."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from numpy.testing import assert_allclose

from tests.torch_reference import hf_inv_freq
from weightstream.hf_checkpoint import StartCheckpointError
from weightstream.numerics.llama import DecoderLayerUnit
from weightstream.numerics.rope_scaling import (
    RopeScaling,
    hf_rope_config,
    make_rope_scaling,
    rope_from_hf_config,
    rope_inv_freq,
)
from weightstream.params import ParamsError, dump_params, load_params, model_def
from weightstream.params.resolve import rope_scaling
from weightstream.params.schema import LlamaModelParams
from weightstream.training.checkpoints import hf_config
from weightstream.training.hf_start import check_start_checkpoint

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
pytest.importorskip("transformers.modeling_rope_utils", reason="transformers' RoPE functions (hf_inv_freq)")


# ---------------------------------------------------------------------------------------------------------
# Params, config.json, the starting checkpoint
# ---------------------------------------------------------------------------------------------------------
PARAMS: dict[str, Any] = {
    "train_input": {
        "data_processor": "GptHDF5MapDataProcessor",
        "data_dir": "./data/train",
        "batch_size": 2,
        "max_sequence_length": 32,
    },
    "model": {
        "name": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_heads": 4,
        "filter_size": 48,
        "max_position_embeddings": 64,
        "rope_theta": 500000.0,
        "attention_module": "multiquery_attention",
        "extra_attention_params": {"num_kv_groups": 2},
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"num_csx": 1, "max_steps": 1},
}
HF_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
MZ_LLAMA3: dict[str, Any] = {  # the same, as ModelZoo writes it (an int low_freq_factor, as YAML may give it)
    "pos_scaling_type": "llama3",
    "pos_scaling_factor": 8.0,
    "pos_scaling_extra_args": {
        "low_freq_factor": 1,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}
MZ_LINEAR = {"pos_scaling_type": "linear", "pos_scaling_factor": 2.0}


def _params(**model: Any) -> dict[str, Any]:
    p = copy.deepcopy(PARAMS)
    p["model"] |= copy.deepcopy(model)
    return p


@pytest.mark.parametrize("keys", [MZ_LLAMA3, MZ_LINEAR, {}], ids=["llama3", "linear", "none"])
def test_params_reach_the_model_and_survive_dump_and_load(keys: dict[str, Any]) -> None:
    p = load_params(_params(**keys))
    want = make_rope_scaling(
        keys.get("pos_scaling_type", "linear"),
        keys.get("pos_scaling_factor", 1.0),
        keys.get("pos_scaling_extra_args"),
    )
    layer = model_def(p).units[1]
    assert isinstance(layer, DecoderLayerUnit) and isinstance(p.model, LlamaModelParams)
    assert layer.scaling == rope_scaling(p.model) == want
    assert load_params(yaml.safe_load(dump_params(p))) == p  # roles load what the coordinator dumped
    if keys is MZ_LLAMA3:
        assert want == RopeScaling("llama3", 8.0, 1.0, 4.0, 16)


def _llama3_args(**changes: Any) -> dict[str, Any]:
    """MZ_LLAMA3 with its extra args changed (a value None: left out)."""
    args = {k: v for k, v in (MZ_LLAMA3["pos_scaling_extra_args"] | changes).items() if v is not None}
    return {**MZ_LLAMA3, "pos_scaling_extra_args": args}


TYPE, FACTOR, ARGS = "model.pos_scaling_type", "model.pos_scaling_factor", "model.pos_scaling_extra_args"
PARAMS_ERRORS = {  # id: (keys, the key path blamed, words of its message)
    "yarn": ({"pos_scaling_type": "YaRN"}, TYPE, "YaRN RoPE scaling is not implemented"),
    "longrope": ({"pos_scaling_type": "longrope"}, TYPE, "longrope RoPE scaling is not implemented"),
    "unknown-type": ({"pos_scaling_type": "dynamic"}, TYPE, "'linear' or 'llama3'"),
    "zero-factor": ({"pos_scaling_factor": 0.0}, FACTOR, "greater than 0"),
    "negative-factor": ({**MZ_LLAMA3, "pos_scaling_factor": -2.0}, FACTOR, "greater than 0"),
    "llama3-no-args": (
        {"pos_scaling_type": "llama3", "pos_scaling_factor": 8.0},
        ARGS,
        "llama3 RoPE scaling needs low_freq_factor, high_freq_factor, original_max_position_embeddings",
    ),
    "llama3-missing-one": (
        _llama3_args(original_max_position_embeddings=None),
        ARGS,
        "llama3 RoPE scaling needs original_max_position_embeddings",
    ),
    "llama3-foreign-arg": (_llama3_args(beta_fast=32), ARGS, "beta_fast is not an argument of llama3"),
    "linear-with-arg": (
        {**MZ_LINEAR, "pos_scaling_extra_args": {"low_freq_factor": 1.0}},
        ARGS,
        "low_freq_factor is not an argument of linear RoPE scaling",
    ),
    "high-not-above-low": (
        _llama3_args(high_freq_factor=1),
        ARGS,
        "high_freq_factor must be a number larger",
    ),
    "fractional-context": (
        _llama3_args(original_max_position_embeddings=16.5),
        ARGS,
        "original_max_position_embeddings must be a positive integer",
    ),
}


@pytest.mark.parametrize("keys,path,words", list(PARAMS_ERRORS.values()), ids=list(PARAMS_ERRORS))
def test_params_errors_name_the_key(keys: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_params(_params(**keys))
    problems = {p.path: p.message for p in info.value.problems}
    assert path in problems, problems
    assert words in problems[path], problems[path]


def test_trainer_layout_means_the_same_and_names_its_own_path() -> None:
    """ModelZoo's trainer: layout (trainer.init.model) gives the same params, and errors at its own path."""
    from weightstream.params.convert import to_trainer

    legacy = _params(**MZ_LLAMA3)
    trainer, _ = to_trainer(copy.deepcopy(legacy))
    assert load_params(trainer) == load_params(legacy)
    del trainer["trainer"]["init"]["model"]["pos_scaling_extra_args"]
    with pytest.raises(ParamsError) as info:
        load_params(trainer)
    (problem,) = info.value.problems
    assert problem.path == "trainer.init.model.pos_scaling_extra_args" and "llama3" in problem.message


def _exported(tmp: Path, keys: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """hf_config of params with ``keys``, written as config.json and read back by transformers."""
    config = hf_config(load_params(_params(**keys)))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config))
    return config, transformers.AutoConfig.from_pretrained(tmp)


@pytest.mark.parametrize("keys", [MZ_LLAMA3, MZ_LINEAR], ids=["llama3", "linear"])
def test_exported_config_loads_in_transformers_with_the_same_rope(
    keys: dict[str, Any], tmp_path: Path
) -> None:
    config, theirs = _exported(tmp_path / "both", keys)
    p = load_params(_params(**keys))
    assert isinstance(p.model, LlamaModelParams)
    scaling = rope_scaling(p.model)
    assert scaling is not None
    assert theirs.rope_parameters["rope_type"] == keys["pos_scaling_type"]
    ours = rope_inv_freq(p.model.head_dim, p.model.rope_theta, scaling)
    assert_allclose(ours, hf_inv_freq(theirs), rtol=1e-6)
    assert rope_from_hf_config(config) == (500000.0, scaling)
    # transformers < 5 reads rope_scaling beside rope_theta (linear as {type, factor} since it first had
    # it; llama3 with rope_type, as Llama 3.1's config.json); 5 reads rope_parameters
    assert config["rope_theta"] == 500000.0
    if scaling.kind == "linear":
        assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}
    else:
        assert config["rope_scaling"] == HF_LLAMA3
    assert config["rope_parameters"] == {
        "rope_type": scaling.kind,
        **scaling.hf_fields(),
        "rope_theta": 500000.0,
    }
    # each spelling alone gives transformers the same frequencies
    for drop in ("rope_scaling", "rope_parameters"):
        alone = {k: v for k, v in config.items() if k != drop}
        (tmp_path / drop).mkdir()
        (tmp_path / drop / "config.json").write_text(json.dumps(alone))
        read = transformers.AutoConfig.from_pretrained(tmp_path / drop)
        assert_allclose(hf_inv_freq(read), hf_inv_freq(theirs), rtol=0, err_msg=drop)


def test_unscaled_export_is_unchanged(tmp_path: Path) -> None:
    """No pos_scaling keys: config.json's RoPE entries are what they were before scaling existed."""
    config, theirs = _exported(tmp_path, {})
    assert "rope_scaling" not in config
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert theirs.rope_parameters["rope_type"] == "default"
    assert hf_rope_config(10.0, None) == {
        "rope_theta": 10.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10.0},
    }


HF_CONFIGS = {
    "v5": {"rope_parameters": {**HF_LLAMA3, "rope_theta": 1000.0}},
    "v4-linear": {"rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "v4-llama3": {"rope_theta": 1000.0, "rope_scaling": HF_LLAMA3},
    # rope_scaling wins over rope_parameters, and then theta comes from beside it, not from rope_parameters
    "both": {
        "rope_scaling": {"rope_type": "linear", "factor": 3.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
    },
    "llama3-no-context": {
        "rope_parameters": {k: v for k, v in HF_LLAMA3.items() if k != "original_max_position_embeddings"}
    },
    "theta-only": {"rope_theta": 1000.0},
    "theta-inside-wins": {
        "rope_theta": 1000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 2000.0},
    },
    "nothing": {},
}


@pytest.mark.parametrize("config", list(HF_CONFIGS.values()), ids=list(HF_CONFIGS))
def test_config_json_reads_as_transformers_reads_it(config: dict[str, Any], tmp_path: Path) -> None:
    config = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, **copy.deepcopy(config)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    theta, scaling = rope_from_hf_config(config)
    assert theta == theirs.rope_parameters["rope_theta"]
    kind = theirs.rope_parameters["rope_type"]
    assert (scaling.kind if scaling else "default") == kind
    if scaling is not None:
        assert_allclose(rope_inv_freq(16, theta, scaling), hf_inv_freq(theirs), rtol=1e-6)


def _saved_llama(tmp: Path, rope: dict[str, Any] | None) -> Path:
    """A LlamaForCausalLM of PARAMS' shape, saved by transformers with ``rope`` scaling."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", **(rope or {}), "rope_theta": 500000.0},
    )
    path = tmp / "hf-llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_starting_checkpoint_must_have_the_params_rope_scaling(tmp_path: Path) -> None:
    hf = _saved_llama(tmp_path, HF_LLAMA3)
    same = load_params(_params(**MZ_LLAMA3))
    assert any("starting from" in n for n in check_start_checkpoint(same, model_def(same), hf))
    for keys, ours in ((MZ_LINEAR, "linear, factor 2.0"), ({}, "none")):
        p = load_params(_params(**keys))
        with pytest.raises(StartCheckpointError) as info:
            check_start_checkpoint(p, model_def(p), hf)
        message = str(info.value)
        assert (
            "config.json's RoPE scaling is llama3, factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0, "
            f"original_max_position_embeddings 16, the params give {ours}"
        ) in message, message
    # llama3's original_max_position_embeddings left out: transformers takes max_position_embeddings
    config = json.loads((hf / "config.json").read_text())
    del config["rope_parameters"]["original_max_position_embeddings"]
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(StartCheckpointError, match="original_max_position_embeddings 64, the params give"):
        check_start_checkpoint(same, model_def(same), hf)
    # a RoPE type weightstream does not implement is refused by name
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0}
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(StartCheckpointError, match="RoPE type 'yarn' is not implemented"):
        check_start_checkpoint(same, model_def(same), hf)


def test_unscaled_checkpoint_starts_unscaled_params(tmp_path: Path) -> None:
    hf = _saved_llama(tmp_path, None)
    p = load_params(_params())
    check_start_checkpoint(p, model_def(p), hf)
    # linear by 1.0 in config.json (transformers 4's spelling) is no scaling, as the params' default is
    config = json.loads((hf / "config.json").read_text())
    del config["rope_parameters"]
    config |= {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 1.0}}
    (hf / "config.json").write_text(json.dumps(config))
    check_start_checkpoint(p, model_def(p), hf)

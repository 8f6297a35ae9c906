"""ModelZoo's trainer: layout and the legacy layout mean the same; problems and the key report name keys
as the user wrote them; keys that change nothing are reported, keys that would are refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.params_files import LEGACY, TRAINER_YAML
from weightstream.params import ParamsError, dump_params, load_params, read_params
from weightstream.params.convert import to_trainer


def _trainer() -> dict[str, Any]:
    return yaml.safe_load(TRAINER_YAML)


def _problems(raw: dict[str, Any], **overrides: Any) -> dict[str, str]:
    with pytest.raises(ParamsError) as info:
        load_params(raw, overrides=overrides or None)
    return {q.path: str(q) for q in info.value.problems}


def test_trainer_layout_means_the_legacy_file() -> None:
    assert dump_params(load_params(_trainer())) == dump_params(load_params(LEGACY))


def test_trainer_layout_keys_land_where_they_act() -> None:
    p = load_params(_trainer())
    assert p.runconfig.num_csx == 2 and p.runconfig.num_wgt_servers == 2 and p.runconfig.seed == 3
    assert p.runconfig.max_steps == 100 and p.runconfig.checkpoint_steps == 50 and p.runconfig.log_steps == 5
    assert p.runconfig.keep_checkpoint_max == 2 and p.train_input.micro_batch_size == 4
    assert p.optimizer.max_gradient_norm == 1.0 and p.model.fp16_type == "bfloat16"
    assert [q.scheduler for q in p.optimizer.learning_rate] == ["Linear", "CosineDecay"]
    assert p.eval_input is not None and p.eval_input.shuffle is False


def test_problems_name_the_key_as_written() -> None:
    raw = _trainer()
    init = raw["trainer"]["init"]
    init["loop"]["max_steps"] = 0
    init["optimizer"]["AdamW"]["betaz"] = [0.9, 0.9]
    init["schedulers"][0]["SequentialLR"]["schedulers"][1]["CosineDecayLR"]["total_iters"] = -1
    init["model"]["hidden_sise"] = 3
    init["loggin"] = {}
    got = _problems(raw)
    assert "trainer.init.loop.max_steps" in got
    assert "did you mean 'betas'" in got["trainer.init.optimizer.AdamW.betaz"]
    assert "trainer.init.schedulers[0].SequentialLR.schedulers[1].CosineDecayLR.total_iters" in got
    assert "did you mean 'hidden_size'" in got["trainer.init.model.hidden_sise"]
    assert "did you mean 'logging'" in got["trainer.init.loggin"]
    raw = _trainer()
    raw["trainer"]["fit"]["train_dataloader"]["batch_size"] = 15
    # a message that names another key names it as written too
    got = _problems(raw)
    assert "trainer.init.backend.cluster_config.num_csx=2" in got["trainer.fit.train_dataloader.batch_size"]


def test_command_line_overrides_act_and_are_named() -> None:
    got = _problems(_trainer(), num_csx=3)
    assert "must be divisible by --num_csx=3" in got["trainer.fit.train_dataloader.batch_size"]
    loaded = read_params(_trainer(), overrides={"num_csx": 4, "max_steps": 7})
    assert loaded.params.runconfig.num_csx == 4 and loaded.params.runconfig.max_steps == 7
    by_path = {u.path: u for u in loaded.report}
    assert by_path["--num_csx"].value == 4 and "trainer.init.backend.cluster_config.num_csx" not in by_path
    assert [u.path for u in loaded.report].count("--num_csx") == 1


def test_key_report_says_what_each_key_does() -> None:
    report = {u.path: u for u in read_params(_trainer()).report}
    assert report["trainer.init.loop.max_steps"].action == "used"
    assert "bfloat16" in report["trainer.init.precision.fp16_type"].note
    for key in (
        "trainer.init.backend.backend_type",
        "trainer.init.precision.loss_scaling_factor",
        "trainer.init.precision.precision_opt_level",
        "trainer.init.precision.log_loss_scale",
        "trainer.init.callbacks[0].ComputeNorm",
        "trainer.fit.train_dataloader.prefetch_factor",
        "trainer.validate",
        "trainer.validate_all",
    ):
        assert report[key].action == "not applicable" and report[key].note, key
    # every key of the file is in the report, in the file's order
    paths = [u.path for u in read_params(_trainer()).report]
    assert paths.index("trainer.init.model.name") < paths.index("trainer.fit.train_dataloader.batch_size")
    assert len(paths) == len(set(paths))


def test_legacy_keys_that_change_nothing_are_reported() -> None:
    raw = copy.deepcopy(LEGACY)
    raw["train_input"] |= {"prefetch_factor": 10, "persistent_workers": True}
    raw["optimizer"] |= {"loss_scaling_factor": "dynamic", "initial_loss_scale": 2**31}
    raw["model"] |= {"label_smoothing": 0.0, "embedding_layer_norm": False}
    raw["runconfig"] |= {"mode": "train", "precision_opt_level": 1}
    loaded = read_params(raw)
    assert dump_params(loaded.params) == dump_params(load_params(LEGACY))
    ignored = {u.path for u in loaded.report if u.action == "not applicable"}
    assert {
        "train_input.prefetch_factor",
        "optimizer.loss_scaling_factor",
        "model.label_smoothing",
        "runconfig.mode",
    } <= ignored


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("model", "label_smoothing", 0.1),
        ("model", "embedding_layer_norm", True),
        ("model", "use_position_embedding", False),
        ("runconfig", "mode", "eval"),
        ("train_input", "repeat", False),
        ("optimizer", "grad_accum_steps", 4),
        ("model", "mup_base_hidden_size", 256),
        ("model", "attention_sliding_window_length", 128),
    ],
)
def test_values_that_would_change_training_are_refused(section: str, key: str, value: Any) -> None:
    raw = copy.deepcopy(LEGACY)
    raw[section][key] = value
    assert f"{section}.{key}" in _problems(raw)


def test_trainer_only_keys_are_refused_or_checked() -> None:
    raw = _trainer()
    raw["trainer"]["init"]["callbacks"] += [{"Lora": {"lora_params": {}}}, {"MyCallback": {}}]
    raw["trainer"]["init"]["callbacks"].append({"LoadCheckpointStates": {"load_checkpoint_states": "all"}})
    got = _problems(raw)
    assert "LoRA is not implemented" in got["trainer.init.callbacks[3].Lora"]
    assert "is not a known key" in got["trainer.init.callbacks[4].MyCallback"]
    assert "only 'model'" in got["trainer.init.callbacks[5].LoadCheckpointStates.load_checkpoint_states"]
    raw = _trainer()
    raw["trainer"]["init"]["callbacks"].append({"LoadCheckpointStates": {"load_checkpoint_states": "model"}})
    report = {u.path: u for u in read_params(raw).report}
    assert report["trainer.init.callbacks[3].LoadCheckpointStates.load_checkpoint_states"].action == "used"


def test_mixed_precision_switch_in_both_layouts() -> None:
    raw = _trainer()
    raw["trainer"]["init"]["precision"]["enabled"] = False
    assert load_params(raw).model.fp16_type is None
    legacy = copy.deepcopy(LEGACY)
    legacy["model"]["mixed_precision"] = False
    assert load_params(legacy).model.fp16_type is None
    legacy["model"]["mixed_precision"] = True
    assert load_params(legacy).model.fp16_type == "bfloat16"
    legacy["model"]["fp16_type"] = "float16"
    assert "use bfloat16" in _problems(legacy)["model.fp16_type"]


def test_missing_model_name_says_which_line_to_add() -> None:
    raw = copy.deepcopy(LEGACY)
    del raw["model"]["name"]
    assert "add the line `name: gpt2` under `model:`" in _problems(raw)["model.name"]
    raw["model"] |= {"position_embedding_type": "rotary", "norm_type": "rmsnorm", "rotary_dim": 16}
    got = _problems(raw)
    assert "`name: llama`" in got["model.name"]
    assert "model.rotary_dim" not in got  # llama's own key: the missing name is the one problem


def test_legacy_load_checkpoint_states() -> None:
    raw = copy.deepcopy(LEGACY)
    raw["runconfig"]["load_checkpoint_states"] = "model"
    loaded = read_params(raw)
    assert dump_params(loaded.params) == dump_params(load_params(LEGACY))
    assert {u.path: u.action for u in loaded.report}["runconfig.load_checkpoint_states"] == "used"
    raw["runconfig"]["load_checkpoint_states"] = "model,optimizer"
    assert "only 'model'" in _problems(raw)["runconfig.load_checkpoint_states"]


def test_a_left_out_key_takes_modelzoos_default() -> None:
    """cerebras.pytorch's Adam and AdamW default eps to 1e-6 (torch: 1e-8); LLaMA 3.1 leaves it out."""
    raw = _trainer()
    del raw["trainer"]["init"]["optimizer"]["AdamW"]["eps"]
    assert load_params(raw).optimizer.eps == 1e-6


def test_older_runconfig_spelling() -> None:
    raw = copy.deepcopy(LEGACY)
    raw["runconfig"]["max_checkpoints"] = raw["runconfig"].pop("keep_checkpoint_max")
    assert dump_params(load_params(raw)) == dump_params(load_params(LEGACY))


def test_convert_writes_a_trainer_file_that_means_the_same() -> None:
    legacy = copy.deepcopy(LEGACY)
    legacy["runconfig"] |= {"mode": "train", "execution_mode": "pipelined", "rpc_timeout_s": 30.0}
    legacy["eval_input"]["micro_batch_size"] = 8
    converted, notes = to_trainer(legacy)
    assert notes == ["runconfig.mode: 'train' has no place in the trainer: layout (left out)"]
    init = converted["trainer"]["init"]
    assert init["optimizer"] == {"AdamW": {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
    assert init["precision"] == {"fp16_type": "bfloat16", "max_gradient_norm": 1.0}
    assert init["weightstream"] == {"execution_mode": "pipelined", "rpc_timeout_s": 30.0}
    assert list(init["schedulers"][0]["SequentialLR"]["schedulers"][1]) == ["CosineDecayLR"]
    # through YAML text, as the command writes it
    again = yaml.safe_load(yaml.safe_dump(converted))
    assert dump_params(load_params(again)) == dump_params(load_params(legacy))
    assert legacy["runconfig"]["mode"] == "train"  # the input is left as it was


def test_convert_a_constant_rate_and_a_checkpoint_path() -> None:
    legacy = copy.deepcopy(LEGACY)
    legacy["optimizer"]["learning_rate"] = 1e-3
    legacy["runconfig"]["checkpoint_path"] = "/models/gpt"
    converted, _ = to_trainer(legacy)
    assert converted["trainer"]["init"]["schedulers"] == [{"ConstantLR": {"learning_rate": 1e-3}}]
    assert converted["trainer"]["fit"]["ckpt_path"] == "/models/gpt"
    assert dump_params(load_params(converted)) == dump_params(load_params(legacy))


def test_sequential_milestones_and_an_optimizer_rate_beside_schedulers() -> None:
    raw = _trainer()
    init = raw["trainer"]["init"]
    init["schedulers"][0]["SequentialLR"]["milestones"] = [10]
    init["optimizer"]["AdamW"]["lr"] = 0.5
    loaded = read_params(raw)
    assert dump_params(loaded.params) == dump_params(load_params(LEGACY))  # the schedulers win
    report = {u.path: u for u in loaded.report}
    assert report["trainer.init.optimizer.AdamW.lr"].action == "not applicable"
    init["schedulers"][0]["SequentialLR"]["milestones"] = [12]
    assert "running sums" in _problems(raw)["trainer.init.schedulers[0].SequentialLR.milestones"]
    del init["schedulers"]  # without schedulers the optimizer's rate is a constant schedule
    assert load_params(raw).optimizer.learning_rate[0].learning_rate == 0.5

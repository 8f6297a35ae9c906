"""Params validation: good files load; each bad file is rejected naming the key path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from weightstream.numerics.optim import learning_rate_at
from weightstream.params import ParamsError, dump_params, load_params, model_def, optimizer_config
from weightstream.params.schema import GPT2ModelParams

EXAMPLES = Path(__file__).parents[3] / "services" / "weightstream" / "examples"

GOOD: dict[str, Any] = {
    "train_input": {
        "data_processor": "TextFileDataProcessor",
        "data_dir": "./data/train",
        "batch_size": 32,
        "max_sequence_length": 128,
        "shuffle": True,
        "shuffle_seed": 1,
    },
    "eval_input": {
        "data_processor": "TextFileDataProcessor",
        "data_dir": "./data/val",
        "batch_size": 32,
        "max_sequence_length": 128,
    },
    "model": {
        "name": "gpt2",
        "vocab_size": 256,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_heads": 4,
        "filter_size": 1024,
        "max_position_embeddings": 128,
        "position_embedding_type": "learned",
        "share_embedding_weights": True,
        "nonlinearity": "gelu",
        "layer_norm_epsilon": 1.0e-5,
        "dropout_rate": 0.0,
        "fp16_type": None,
    },
    "optimizer": {
        "optimizer_type": "adamw",
        "betas": [0.9, 0.95],
        "eps": 1.0e-8,
        "weight_decay": 0.01,
        "max_gradient_norm": 1.0,
        "learning_rate": [
            {
                "scheduler": "Linear",
                "initial_learning_rate": 0.0,
                "end_learning_rate": 3.0e-4,
                "total_iters": 50,
            },
            {
                "scheduler": "CosineDecay",
                "initial_learning_rate": 3.0e-4,
                "end_learning_rate": 3.0e-5,
                "total_iters": 950,
            },
        ],
    },
    "runconfig": {
        "num_csx": 2,
        "num_wgt_servers": 2,
        "num_act_servers": 1,
        "max_steps": 1000,
        "log_steps": 10,
        "checkpoint_steps": 200,
        "eval_frequency": 200,
        "eval_steps": 10,
        "seed": 1,
        "model_dir": "./model_dir",
        "autoload_last_checkpoint": True,
    },
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """GOOD with one key set (value ...) or deleted (value is DELETE)."""
    d = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node: Any = d
    for k in parents:
        node = node[int(k)] if k.isdigit() else node[k]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return d


DELETE = object()

# (what is wrong, the edit, the key path the message must name, a word the message must contain)
BAD = [
    ("unknown key", ("model.hiden_size", 3), "model.hiden_size", "hidden_size"),
    ("unknown section", ("runconfg", {}), "runconfg", "runconfig"),
    ("wrong type", ("model.num_heads", "four"), "model.num_heads", "integer"),
    ("negative", ("runconfig.max_steps", -5), "runconfig.max_steps", "greater than 0"),
    ("negative seed", ("runconfig.seed", -1), "runconfig.seed", "greater than or equal to 0"),
    (
        "negative data seed",
        ("train_input.shuffle_seed", -3),
        "train_input.shuffle_seed",
        "greater than or equal",
    ),
    (
        "keep no checkpoint",
        ("runconfig.keep_checkpoint_max", 0),
        "runconfig.keep_checkpoint_max",
        "greater than 0",
    ),
    (
        "no heartbeat timeout",
        ("runconfig.heartbeat_timeout_s", 0),
        "runconfig.heartbeat_timeout_s",
        "greater than 0",
    ),
    ("heads do not divide", ("model.num_heads", 3), "model.hidden_size", "divisible"),
    ("batch not divisible", ("train_input.batch_size", 33), "train_input.batch_size", "num_csx"),
    ("eval batch not divisible", ("eval_input.batch_size", 31), "eval_input.batch_size", "num_csx"),
    ("data_dir missing", ("train_input.data_dir", DELETE), "train_input.data_dir", "required"),
    ("missing section", ("optimizer", DELETE), "optimizer", "missing"),
    ("missing model key", ("model.vocab_size", DELETE), "model.vocab_size", "missing"),
    ("unknown model name", ("model.name", "bert"), "model.name", "gpt2"),
    (
        "sequence too long",
        ("train_input.max_sequence_length", 129),
        "train_input.max_sequence_length",
        "max_position_embeddings",
    ),
    ("vocab too small for bytes", ("model.vocab_size", 100), "model.vocab_size", "256"),
    ("dropout of 1", ("model.attention_dropout_rate", 1.0), "model.attention_dropout_rate", "less than 1"),
    ("dropout out of range", ("model.dropout_rate", 1.0), "model.dropout_rate", "less than 1"),
    (
        "unsupported position type",
        ("model.position_embedding_type", "rotary"),
        "model.position_embedding_type",
        "learned",
    ),
    ("unsupported fp16 type", ("model.fp16_type", "float16"), "model.fp16_type", "bfloat16"),
    (
        "known ModelZoo key not implemented",
        ("model.rotary_dim", 64),
        "model.rotary_dim",
        "does not implement",
    ),
    (
        "ModelZoo key whose value would change training",
        ("train_input.repeat", False),
        "train_input.repeat",
        "cannot be honoured",
    ),
    (
        "ModelZoo optimizer key",
        ("optimizer.max_gradient_value", 1.0),
        "optimizer.max_gradient_value",
        "max_gradient_norm",
    ),
    ("sparsity without a level", ("sparsity", {"init_method": "topk"}), "sparsity.sparsity", "required"),
    ("dense sparsity", ("sparsity", {"sparsity": 1.0}), "sparsity.sparsity", "[0, 1)"),
    ("dynamic sparsity", ("sparsity", {"sparsity": 0.5, "algorithm": "rigl"}), "sparsity.algorithm", "gmp"),
    ("constant gmp", ("sparsity", {"sparsity": 0.5, "algorithm": "gmp"}), "sparsity.sparsity", "static"),
    ("gmp schedule", ("sparsity", {"sparsity": 0.5, "schedule": [1]}), "sparsity", "one of sparsity and"),
    ("unknown init", ("sparsity", {"sparsity": 0.5, "init_method": "snip"}), "sparsity.init_method", "topk"),
    ("unknown sparsity key", ("sparsity", {"sparsity": 0.5, "type": "static"}), "sparsity.type", "algorithm"),
    (
        "sparse embedding",
        ("sparsity", {"sparsity": 0.5, "param_filter": ["*.wte.*"]}),
        "sparsity.param_filter[0]",
        "cannot be sparse",
    ),
    (
        "filter matching nothing",
        ("sparsity", {"sparsity": 0.5, "param_filter": "*.c_fc.weight*x"}),
        "sparsity.param_filter",
        "matches no tensor",
    ),
    (
        "level glob matching nothing",
        ("sparsity", {"sparsity": {"*.c_fc.weight": 0.5, "*.q_proj.*": 0.9}}),
        "sparsity.sparsity['*.q_proj.*']",
        "matches no tensor",
    ),
    ("unknown optimizer", ("optimizer.optimizer_type", "lamb"), "optimizer.optimizer_type", "adamw"),
    ("no bias correction", ("optimizer.correct_bias", False), "optimizer.correct_bias", "always applies"),
    (
        "no bias correction, older name",
        ("optimizer.use_bias_correction", False),
        "optimizer.correct_bias",
        "only true",
    ),
    ("amsgrad", ("optimizer.amsgrad", True), "optimizer.amsgrad", "not implemented"),
    ("both beta spellings", ("optimizer.beta1", 0.8), "optimizer", "betas or beta1/beta2"),
    ("both eps spellings", ("optimizer.epsilon", 1e-6), "optimizer", "epsilon and eps"),
    ("beta out of range", ("optimizer.betas", [0.9, 1.5]), "optimizer.betas[1]", "less than 1"),
    ("momentum on adam", ("optimizer.momentum", 0.9), "optimizer.momentum", "sgd"),
    (
        "unknown scheduler",
        ("optimizer.learning_rate.1.scheduler", "StepLR"),
        "optimizer.learning_rate[1].scheduler",
        "CosineDecay",
    ),
    (
        "scheduler needs total_iters",
        ("optimizer.learning_rate.0.total_iters", DELETE),
        "optimizer.learning_rate[0].total_iters",
        "required",
    ),
    ("negative lr", ("optimizer.learning_rate", -1.0), "optimizer.learning_rate", "greater than or equal"),
    ("eval without eval_input", ("eval_input", DELETE), "runconfig.eval_frequency", "eval_input"),
    ("too many weight servers", ("runconfig.num_wgt_servers", 7), "runconfig.num_wgt_servers", "6"),
    (
        "digits for gpt2",
        ("train_input.data_processor", "DigitsDataProcessor"),
        "train_input.data_processor",
        "fc_mlp",
    ),
    (
        "unknown data processor",
        ("train_input.data_processor", "HDF5DataProcessor"),
        "train_input.data_processor",
        "SyntheticDataProcessor",
    ),
]


def test_older_optimizer_spellings_mean_what_the_current_ones_do() -> None:
    """ModelZoo's beta1/beta2, epsilon, weight_decay_rate, use_bias_correction/correct_bias: true,
    amsgrad: false and a schedule's steps configure exactly what betas, eps, weight_decay and
    total_iters do."""
    current = load_params(GOOD)
    raw = copy.deepcopy(GOOD)
    opt = raw["optimizer"]
    opt["beta1"], opt["beta2"] = opt.pop("betas", [0.9, 0.999])
    opt["weight_decay_rate"] = opt.pop("weight_decay", 0.0)
    opt["epsilon"] = opt.pop("eps", 1e-8)
    opt |= {"use_bias_correction": True, "amsgrad": False}
    for piece in opt["learning_rate"] if isinstance(opt["learning_rate"], list) else []:
        if "total_iters" in piece:
            piece["steps"] = piece.pop("total_iters")
    older = load_params(raw)
    assert optimizer_config(older.optimizer) == optimizer_config(current.optimizer)
    assert older.optimizer == current.optimizer


def test_modelzoo_names_for_what_weightstream_implements() -> None:
    """model.name: gpt3 (ModelZoo's GPT-3: GPT-2's architecture) and GptHDF5DataProcessor (the same files
    as its Map variant) load as gpt2 and GptHDF5MapDataProcessor do."""
    raw = copy.deepcopy(GOOD)
    raw["model"]["name"] = "gpt3"
    gpt3 = load_params(raw)
    assert model_def(gpt3).specs == model_def(load_params(GOOD)).specs
    assert "name: gpt3" in dump_params(gpt3)  # the file as written, in model_dir/params.yaml
    raw["model"]["num_heads"] = 3
    with pytest.raises(ParamsError, match=r"model\.hidden_size"):  # gpt2's checks apply to gpt3
        load_params(raw)
    raw["model"]["hiden_size"] = raw["model"].pop("hidden_size")
    with pytest.raises(ParamsError, match="did you mean 'hidden_size'"):  # and its key hints
        load_params(raw)
    raw = copy.deepcopy(GOOD)
    raw["train_input"] |= {"data_processor": "GptHDF5DataProcessor", "data_dir": "./data"}
    assert load_params(raw).train_input.data_processor == "GptHDF5MapDataProcessor"


def test_good_params_load() -> None:
    p = load_params(GOOD)
    assert isinstance(p.model, GPT2ModelParams)
    assert p.runconfig.num_csx == 2 and p.model.inner_size == 1024
    assert model_def(p).family == "gpt2"
    cfg = optimizer_config(p.optimizer)
    assert cfg.kind == "adamw" and learning_rate_at(cfg.schedule, 50) == 3.0e-4
    assert cfg.exclude_bias_and_norm  # ModelZoo's default: biases and norms are not decayed
    raw = _with("optimizer.exclude_bias_and_norm_from_weight_decay", False)
    assert not optimizer_config(load_params(raw).optimizer).exclude_bias_and_norm


@pytest.mark.parametrize("name,edit,path,word", BAD, ids=[b[0] for b in BAD])
def test_bad_params_rejected_with_key_path(name: str, edit: tuple[str, Any], path: str, word: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_params(_with(*edit))
    paths = [p.path for p in info.value.problems]
    assert path in paths, f"{name}: expected a problem at {path}, got {paths}"
    msg = next(str(p) for p in info.value.problems if p.path == path)
    assert word in msg, f"{name}: message {msg!r} lacks {word!r}"
    assert path in str(info.value)


def test_all_problems_are_reported_at_once() -> None:
    d = _with("model.num_heads", 3)
    d["runconfig"]["max_steps"] = 0
    d["model"]["hiden"] = 1
    with pytest.raises(ParamsError) as info:
        load_params(d)
    assert {"runconfig.max_steps", "model.hiden"} <= {p.path for p in info.value.problems}


def test_overrides_replace_runconfig_and_are_validated() -> None:
    assert load_params(GOOD, overrides={"num_csx": 4}).runconfig.num_csx == 4
    with pytest.raises(ParamsError, match=r"train_input.batch_size: must be divisible by --num_csx=5"):
        load_params(GOOD, overrides={"num_csx": 5})


def test_scalar_learning_rate_and_case_insensitive_names() -> None:
    d = _with("optimizer.learning_rate", 1e-3)
    d["optimizer"]["optimizer_type"] = "AdamW"
    p = load_params(d)
    assert p.optimizer.optimizer_type == "adamw"
    assert optimizer_config(p.optimizer).learning_rate(10**9) == 1e-3


def test_files_and_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="cannot be read"):
        load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping"):
        load_params(bad)


def test_resolved_params_round_trip(tmp_path: Path) -> None:
    p = load_params(GOOD)
    out = tmp_path / "params.yaml"
    out.write_text(dump_params(p))
    assert load_params(out) == p
    assert yaml.safe_load(out.read_text())["model"]["use_ffn_bias"] is True  # defaults are written out


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda f: f.stem)
def test_shipped_examples_are_valid(example: Path) -> None:
    load_params(example)


@pytest.mark.parametrize(
    ("section", "key", "value", "path"),
    [
        ("optimizer", "learning_rate", float("inf"), "optimizer.learning_rate"),
        ("optimizer", "learning_rate", "Infinity", "optimizer.learning_rate"),
        ("optimizer", "betas", [float("nan"), 0.999], "optimizer.betas[0]"),
        ("optimizer", "eps", "nan", "optimizer.eps"),
        ("optimizer", "max_gradient_norm", float("-inf"), "optimizer.max_gradient_norm"),
        ("runconfig", "rpc_timeout_s", float("inf"), "runconfig.rpc_timeout_s"),
    ],
    ids=["lr-inf", "lr-Infinity-string", "beta-nan", "eps-nan-string", "clip-minus-inf", "timeout-inf"],
)
def test_non_finite_numbers_are_rejected(section: str, key: str, value: Any, path: str) -> None:
    """A NaN or an infinity is never a setting (YAML's .inf/.nan, or strings pydantic would coerce)."""
    raw = copy.deepcopy(GOOD)
    raw[section][key] = value
    with pytest.raises(ParamsError) as e:
        load_params(raw)
    assert any(p.path.startswith(path) for p in e.value.problems), e.value


def test_non_finite_number_inside_a_schedule_piece_is_rejected() -> None:
    raw = copy.deepcopy(GOOD)
    raw["optimizer"]["learning_rate"] = [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": ".inf", "total_iters": 5}
    ]
    with pytest.raises(ParamsError, match=r"optimizer\.learning_rate\[0\]\.end_learning_rate"):
        load_params(raw)


def test_keep_checkpoint_max_is_modelzoos_key_and_optional() -> None:
    assert load_params(_with("runconfig.keep_checkpoint_max", 3)).runconfig.keep_checkpoint_max == 3
    assert load_params(GOOD).runconfig.keep_checkpoint_max is None  # absent: every checkpoint is kept


def test_embedding_dropout_follows_dropout_rate_unless_given() -> None:
    """ModelZoo's default: embedding_dropout_rate left out is dropout_rate, for the model and config.json."""
    from weightstream.training.checkpoints import hf_config

    raw = _with("model.dropout_rate", 0.3)
    p = load_params(raw)
    assert model_def(p).units[0].dropout_rate == 0.3  # type: ignore[attr-defined]
    assert (hf_config(p)["resid_pdrop"], hf_config(p)["embd_pdrop"]) == (0.3, 0.3)
    raw["model"]["embedding_dropout_rate"] = 0.1
    p = load_params(raw)
    assert model_def(p).units[0].dropout_rate == 0.1  # type: ignore[attr-defined]
    assert hf_config(p)["embd_pdrop"] == 0.1

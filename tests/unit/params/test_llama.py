"""Params for the LLaMA family and ModelZoo's HDF5 input: good files load, bad ones name the key."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from weightstream.params import ParamsError, load_params, model_def
from weightstream.params.schema import LlamaModelParams
from weightstream.params.size import num_params

LLAMA: dict[str, Any] = {
    "train_input": {
        "data_processor": "GptHDF5MapDataProcessor",
        "data_dir": "./data/train",
        "batch_size": 8,
        "max_sequence_length": 64,
        "shuffle_seed": 1,
    },
    "model": {
        "name": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 172,
        "max_position_embeddings": 128,
        "position_embedding_type": "rotary",
        "rope_theta": 500000.0,
        "rotary_dim": 16,
        "norm_type": "rmsnorm",
        "nonlinearity": "swiglu",
        "use_ffn_bias": False,
        "use_projection_bias_in_attention": False,
        "use_ffn_bias_in_attention": False,
        "use_bias_in_output": False,
        "share_embedding_weights": False,
        "layer_norm_epsilon": 1.0e-5,
        "attention_module": "multiquery_attention",
        "extra_attention_params": {"num_kv_groups": 2},
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3, "weight_decay": 0.1},
    "runconfig": {"num_csx": 2, "max_steps": 10},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(LLAMA)
    *parents, last = path.split(".")
    node = d
    for k in parents:
        node = node[k]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return d


DELETE = object()


def test_llama_params_load_with_modelzoo_keys() -> None:
    p = load_params(LLAMA)
    m = p.model
    assert m.name == "llama" and m.num_kv_heads == 2 and m.head_dim == 16 and m.rope_theta == 500000.0
    assert p.train_input.drop_last is None and p.train_input.num_workers == 0
    # aiayn_attention (or no attention_module at all) is multi-head attention: as many kv heads as heads
    plain = copy.deepcopy(LLAMA)
    del plain["model"]["attention_module"], plain["model"]["extra_attention_params"]
    plain_model = load_params(plain).model
    assert isinstance(plain_model, LlamaModelParams) and plain_model.num_kv_heads == 4
    # multiquery_attention without extra_attention_params: one kv head (multi-query attention)
    mqa = load_params(_with("model.extra_attention_params", DELETE)).model
    assert isinstance(mqa, LlamaModelParams) and mqa.num_kv_heads == 1


def test_llama_parameter_count_in_closed_form() -> None:
    """num_params (used by the service's size limits before anything is built) counts LLaMA's tensors:
    c=64, kv=2x16, f=172, vocab 512, 2 layers, untied, no biases."""
    c, kv, f, v = 64, 32, 172, 512
    block = 2 * c + 2 * c * c + 2 * kv * c + 3 * c * f
    assert num_params(load_params(LLAMA).model) == 2 * v * c + 2 * block + c
    biased = _with("model.use_projection_bias_in_attention", True)
    biased["model"]["use_ffn_bias_in_attention"] = True
    biased["model"]["use_ffn_bias"] = True
    assert num_params(load_params(biased).model) == 2 * v * c + 2 * (block + 2 * c + 2 * kv + 2 * f + c) + c
    for raw in (LLAMA, biased, _with("model.share_embedding_weights", True)):  # and the model built
        p = load_params(raw)
        assert model_def(p).family == "llama" and model_def(p).num_params == num_params(p.model)


BAD = [
    (
        "kv groups must divide heads",
        ("model.extra_attention_params", {"num_kv_groups": 3}),
        "model.extra_attention_params.num_kv_groups",
        "num_heads=4",
    ),
    ("rotary_dim must be the head size", ("model.rotary_dim", 8), "model.rotary_dim", "16"),
    (
        "attention biases must agree",
        ("model.use_projection_bias_in_attention", True),
        "model.use_ffn_bias_in_attention",
        "q, k, v and o",
    ),
    ("no bias in the head", ("model.use_bias_in_output", True), "model.use_bias_in_output", "False"),
    ("filter_size is required", ("model.filter_size", DELETE), "model.filter_size", "required"),
    (
        "learned positions are gpt2's",
        ("model.position_embedding_type", "learned"),
        "model.position_embedding_type",
        "rotary",
    ),
    ("layernorm is gpt2's", ("model.norm_type", "layernorm"), "model.norm_type", "rmsnorm"),
    ("gelu is gpt2's", ("model.nonlinearity", "gelu"), "model.nonlinearity", "swiglu"),
    ("dropout not for llama", ("model.dropout_rate", 0.1), "model.dropout_rate", "0.0"),
    ("unknown llama key", ("model.rope_thetaa", 1.0), "model.rope_thetaa", "rope_theta"),
    ("odd head size", ("model.num_heads", 64), "model.num_heads", "even"),
    ("hdf5 needs a data_dir", ("train_input.data_dir", DELETE), "train_input.data_dir", "mixture"),
    (
        "mixture and data_dir exclude each other",
        ("train_input.mixture", [{"data_dir": "x", "weight": 1}]),
        "train_input.mixture",
        "data_dir",
    ),
    (
        "mixture weight positive",
        ("train_input.mixture", [{"data_dir": "x", "weight": 0}]),
        "train_input.mixture[0].weight",
        "greater than 0",
    ),
]


@pytest.mark.parametrize("name,edit,path,word", BAD, ids=[b[0] for b in BAD])
def test_bad_llama_params_name_the_key(name: str, edit: tuple[str, Any], path: str, word: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_params(_with(*edit))
    problems = {p.path: p.message for p in info.value.problems}
    assert path in problems, (name, problems)
    assert word in problems[path] or word in str(info.value), (name, problems[path])


def test_rotary_keys_are_gpt2s_unsupported_but_llamas_own() -> None:
    """rope_theta is a known ModelZoo key: for gpt2 it is rejected saying rotary is llama's; for llama it
    is a key like any other."""
    gpt2 = copy.deepcopy(LLAMA)
    gpt2["model"] = {
        "name": "gpt2",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "max_position_embeddings": 128,
        "rope_theta": 10000.0,
    }
    with pytest.raises(ParamsError) as info:
        load_params(gpt2)
    (problem,) = [p for p in info.value.problems if p.path == "model.rope_theta"]
    assert "llama" in problem.message


def test_mixture_loads_for_hdf5_only() -> None:
    mix = _with("train_input.data_dir", DELETE)
    mix["train_input"]["mixture"] = [{"data_dir": "a", "weight": 3}, {"data_dir": "b"}]
    p = load_params(mix)
    assert [(m.data_dir, m.weight) for m in p.train_input.mixture or []] == [("a", 3.0), ("b", 1.0)]
    mix["train_input"]["data_processor"] = "TextFileDataProcessor"
    with pytest.raises(ParamsError) as info:
        load_params(mix)
    assert any(p.path == "train_input.mixture" for p in info.value.problems)

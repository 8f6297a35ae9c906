"""Attention dropout's params end: ``attention_dropout_rate`` in the params (left out 0.0, null follows
``dropout_rate``), refused for LLaMA with the reason, recorded in config.json as ``attn_pdrop``, and a
Hugging Face start checkpoint takes the params' rate. The kernel and the model: test_attention_dropout.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.params_files import TINY
from weightstream.params import ParamsError, dump_params, load_params, model_def
from weightstream.params.schema import GPT2ModelParams
from weightstream.training.checkpoints import hf_config


def _raw(**model: Any) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    raw["model"].update(model)
    return raw


def _block_rates(raw: dict[str, Any]) -> set[float]:
    return {u.attention_dropout_rate for u in model_def(load_params(raw)).units[1:-1]}  # type: ignore[attr-defined]


def test_params_set_the_rate_and_survive_dump_and_load() -> None:
    assert _block_rates(_raw()) == {0.0}  # left out: 0.0, what such a file trained with before
    assert _block_rates(_raw(attention_dropout_rate=0.15)) == {0.15}
    assert _block_rates(_raw(dropout_rate=0.2, attention_dropout_rate=None)) == {0.2}  # null: dropout_rate
    assert _block_rates(_raw(name="gpt3", attention_dropout_rate=0.1)) == {0.1}
    p = load_params(_raw(attention_dropout_rate=0.15))
    again = load_params(yaml.safe_load(dump_params(p)))  # as the roles load it
    assert isinstance(again.model, GPT2ModelParams)
    assert again == p and again.model.attention_dropout == 0.15
    with pytest.raises(ParamsError, match=r"model\.attention_dropout_rate.*less than 1"):
        load_params(_raw(attention_dropout_rate=1.0))


def test_llama_refuses_attention_dropout_with_the_reason() -> None:
    raw = _raw(name="llama", filter_size=64, attention_dropout_rate=0.1)
    with pytest.raises(ParamsError, match=r"model\.attention_dropout_rate: must be 0\.0 for llama"):
        load_params(raw)
    raw["model"]["attention_dropout_rate"] = 0.0
    load_params(raw)


def test_config_json_records_attn_pdrop_and_a_start_checkpoint_takes_it_from_the_params(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers", reason="writes the start checkpoint")
    from weightstream.training.hf_start import check_start_checkpoint

    params = load_params(_raw(attention_dropout_rate=0.25))
    assert hf_config(params)["attn_pdrop"] == 0.25
    m = TINY["model"]
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=m["vocab_size"],
            n_positions=m["max_position_embeddings"],
            n_embd=m["hidden_size"],
            n_layer=m["num_hidden_layers"],
            n_head=m["num_heads"],
            n_inner=m["filter_size"],
            activation_function="gelu",
            attn_pdrop=0.0,
        )
    )
    hf.save_pretrained(tmp_path)
    notes = check_start_checkpoint(params, model_def(params), tmp_path)  # no StartCheckpointError
    assert any("attn_pdrop" in n for n in notes)  # training-only: the params' rate, with a note

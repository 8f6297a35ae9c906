"""ModelZoo's own params files, from releases 2.2 to 2.10, validate; a setting a file writes twice (ModelZoo
2.3 and 2.4 write the precision in ``model`` and in ``trainer.init.precision``) is one setting when the
values agree and an error naming both keys and both values when they do not."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from weightstream.params import ParamsError, load_params, read_params

# ModelZoo 2.4's shape (Cerebras-GPT 111M, sizes made small): the precision in both places
TRAINER_24 = """
trainer:
  init:
    backend: {backend_type: CSX}
    model:
      name: gpt3
      hidden_size: 64
      max_position_embeddings: 64
      vocab_size: 256
      num_hidden_layers: 2
      num_heads: 4
      filter_size: 256
      mixed_precision: true
      fp16_type: bfloat16
    optimizer:
      AdamW: {betas: [0.9, 0.95], eps: 1.0e-08, weight_decay: 0.1, correct_bias: true}
    schedulers:
    - LinearLR: {initial_learning_rate: 0.0006, end_learning_rate: 6.0e-05, total_iters: 100}
    precision:
      enabled: true
      fp16_type: bfloat16
      precision_opt_level: 0
      max_gradient_norm: 1.0
    loop: {max_steps: 100}
  fit:
    train_dataloader: {data_processor: SyntheticDataProcessor, max_sequence_length: 32, batch_size: 8}
"""


def _trainer_24() -> dict[str, Any]:
    return yaml.safe_load(TRAINER_24)


def _problems(raw: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ParamsError) as info:
        load_params(raw)
    return {q.path: str(q) for q in info.value.problems}


def test_precision_written_twice_alike_is_one_setting() -> None:
    loaded = read_params(_trainer_24())
    assert loaded.params.model.fp16_type == "bfloat16"
    lines = {u.path: u for u in loaded.report}
    for first, again in (
        ("trainer.init.model.mixed_precision", "trainer.init.precision.enabled"),
        ("trainer.init.model.fp16_type", "trainer.init.precision.fp16_type"),
    ):
        assert again not in lines  # one line per setting, at the key written first
        assert f"also written as {again}, the same value" in lines[first].note
        assert sum(again in u.note for u in loaded.report) == 1


@pytest.mark.parametrize(
    "key,model_key,first,second",
    [
        ("enabled", "mixed_precision", True, False),
        ("enabled", "mixed_precision", True, 1),  # equal in Python, but a number is not the switch
        ("fp16_type", "fp16_type", "bfloat16", "cbfloat16"),
    ],
)
def test_precision_written_twice_differently_is_refused(
    key: str, model_key: str, first: Any, second: Any
) -> None:
    raw = _trainer_24()
    raw["trainer"]["init"]["precision"][key] = second
    got = _problems(raw)
    second_path, first_path = f"trainer.init.precision.{key}", f"trainer.init.model.{model_key}"
    assert list(got) == [second_path]
    assert f"same setting as {first_path}, which is {first!r}" in got[second_path]
    assert f"(got {second!r})" in got[second_path]
    assert "trainer.init.trainer" not in got[second_path]  # the path as written, once


def test_conflict_found_whichever_key_comes_first() -> None:
    raw = _trainer_24()
    init = raw["trainer"]["init"]
    init["model"]["mixed_precision"] = False
    raw["trainer"]["init"] = {"precision": init.pop("precision"), **init}  # precision before model
    got = _problems(raw)
    message = got["trainer.init.model.mixed_precision"]
    assert "same setting as trainer.init.precision.enabled, which is True" in message
    assert "(got False)" in message

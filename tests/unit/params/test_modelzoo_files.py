"""ModelZoo's own params files, from releases 2.2 to 2.10, validate; a setting a file writes twice (ModelZoo
2.3 and 2.4 write the precision in ``model`` and in ``trainer.init.precision``) is one setting when the
values agree and an error naming both keys and both values when they do not."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from weightstream.params import ParamsError, load_params, model_def, read_params

FILES = Path(__file__).parents[2] / "data" / "modelzoo"

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


def test_cluster_pod_memory_changes_nothing() -> None:
    """ModelZoo 2.2 to 2.4's 70B LLaMA files size the Cerebras cluster's pods."""
    raw = yaml.safe_load((FILES / "Release_2.3.1/llama/configs/params_llama2_70b.yaml").read_text())
    raw["model"]["name"] = "llama"
    lines = {u.path: u for u in read_params(raw).report}
    for key in ("compile_crd_memory_gi", "execute_crd_memory_gi"):
        line = lines[f"runconfig.{key}"]
        assert line.action == "not applicable" and "pods" in line.note


def _published() -> list[Path]:
    return sorted(FILES.rglob("*.yaml"))


def test_files_of_several_releases_are_here() -> None:
    releases = {p.relative_to(FILES).parts[0] for p in _published()}
    assert {"Release_2.2.1", "Release_2.3.1", "Release_2.4.0", "Release_2.10.0"} <= releases
    assert (FILES / "LICENSE").is_file() and (FILES / "NOTICE").is_file()


@pytest.mark.parametrize("path", _published(), ids=lambda p: str(p.relative_to(FILES)))
def test_published_file_validates(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    try:
        loaded = read_params(raw)
    except ParamsError as e:  # before ModelZoo 2.4 model.name was not written: the one problem
        assert [q.path for q in e.problems] in (["model.name"], ["trainer.init.model.name"]), e
        asked = re.search(r"add the line `name: (\w+)`", e.problems[0].message)
        release = path.relative_to(FILES).parts[0]
        assert asked is not None and release in ("Release_2.2.1", "Release_2.3.1"), e
        (raw["trainer"]["init"]["model"] if "trainer" in raw else raw["model"])["name"] = asked.group(1)
        loaded = read_params(raw)
    assert model_def(loaded.params).num_params > 0
    init = raw["trainer"]["init"] if "trainer" in raw else {}
    if "mixed_precision" in init.get("model", {}) and "enabled" in init.get("precision", {}):  # 2.3, 2.4
        notes = " ".join(u.note for u in loaded.report)
        assert notes.count("also written as trainer.init.precision.enabled") == 1

"""scripts/modelzoo_configs.py's release sweep: which tags and files it reads, and its verdict on a file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[2]
FILES = ROOT / "tests" / "data" / "modelzoo"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "modelzoo_configs", ROOT / "scripts" / "modelzoo_configs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _git_answers(script: ModuleType, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(script, "_git", lambda git_dir, *args: text)


def test_release_tags_are_2_2_to_2_10_in_version_order(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = "R_1.7.1 Release_1.9.1 Release_2.10.0 Release_2.2.0 Release_2.4.3 Release_2.4.0 rel-2.4.2"
    tags += " Release_2.11.0"
    _git_answers(script, monkeypatch, tags.replace(" ", "\n"))
    assert script.release_tags(Path("repo")) == [
        "Release_2.2.0",
        "Release_2.4.0",
        "Release_2.4.3",
        "Release_2.10.0",
    ]


def test_release_configs_are_the_gpt_and_llama_params_files(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    nlp = "src/cerebras/modelzoo/models/nlp"
    kept = [f"{nlp}/gpt2/configs/params_gpt2_small.yaml", f"{nlp}/gpt3/configs/muP/params_gpt3_40M.yaml"]
    kept.append(f"{nlp}/llama/configs/params_llama2_7b.yaml")
    left = [
        f"{nlp}/bert/configs/bert_base.yaml",
        f"{nlp}/gpt3/model.py",
        f"{nlp}/gptj/configs/params_gptj_6B.yaml",
    ]
    _git_answers(script, monkeypatch, "\n".join(kept + left))
    assert script.release_configs(Path("repo"), "Release_2.2.0") == kept


def _published(path: str) -> dict[str, Any]:
    return yaml.safe_load((FILES / path).read_text())


def test_verdicts(script: ModuleType) -> None:
    assert script.validate(_published("Release_2.4.0/gpt3/configs/Cerebras_GPT/111m.yaml")) == ("ok", [])
    assert script.validate(_published("Release_2.2.1/gpt2/configs/params_gpt2_small.yaml")) == (
        "ok, name added",
        [],
    )
    trainer_23 = _published("Release_2.3.1/llama/configs/params_llama3_8b_v2.yaml")  # trainer:, no name
    assert script.validate(trainer_23) == ("ok, name added", [])
    mup = _published("Release_2.4.0/gpt3/configs/Cerebras_GPT/111m.yaml")
    mup["trainer"]["init"]["model"]["mup_base_hidden_size"] = 256
    verdict, reasons = script.validate(mup)
    assert verdict == "refused"
    assert reasons == [
        ("model.mup_base_hidden_size", "muP (maximal update parametrization) is not implemented")
    ]
    assert script.validate({"description": "not params"}) == ("not a params file", [])

"""What ``weightstream run`` checks before it starts any role (``jobs.admission``'s pipeline, which
``validate`` runs as well): the data, the model's size on this machine, the starting checkpoint; and a run
that has nothing left to do is recognised from one small file."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from weightstream.jobs.admission import Admission, admit
from weightstream.params import ParamsError, load_params, model_def
from weightstream.params.size import num_params
from weightstream.training.preflight import finished_step

Small = Callable[..., dict[str, Any]]


@pytest.fixture
def small_at(small: dict[str, Any], tmp_path: Path) -> Small:
    """The small params file with its model_dir under the test's tmp dir and ``model`` keys changed."""

    def make(**model: Any) -> dict[str, Any]:
        raw = copy.deepcopy(small)
        raw["model"].update(model)
        raw["runconfig"]["model_dir"] = str(tmp_path / "model_dir")
        return raw

    return make


def _problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ParamsError) as e:
        admit(Admission.local(raw))
    return [str(q) for q in e.value.problems]


def test_a_valid_file_passes(tmp_path: Path, small_at: Small) -> None:
    p = admit(Admission.local(small_at())).params
    assert p.model.hidden_size == 32


def test_a_missing_data_dir_is_named_with_its_path(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    raw = small_at()
    raw["train_input"] |= {"data_processor": "TextFileDataProcessor", "data_dir": str(tmp_path / "nope")}
    assert _problems(raw) == [
        f"train_input.data_dir: data_dir {str(tmp_path / 'nope')!r} is not a directory "
        f"(got {str(tmp_path / 'nope')!r})"
    ]


def test_a_batch_larger_than_an_epoch_is_refused_at_batch_size(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("x" * 100, encoding="utf-8")  # 6 samples of 16 tokens
    raw = small_at()
    raw["train_input"] |= {
        "data_processor": "TextFileDataProcessor",
        "data_dir": str(tmp_path / "text"),
        "drop_last": True,
    }
    assert _problems(raw) == [
        "train_input.batch_size: drop_last leaves no batch: batch_size 8 is more than the 6 samples of one "
        "epoch (got 8)"
    ]


def test_an_absurd_size_is_refused_with_its_count_and_the_limit(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    raw = small_at(hidden_size=10**12, num_heads=4)
    (problem,) = _problems(raw)
    n = num_params(load_params(raw).model)
    assert n > 2**63  # beyond int64: counted exactly all the same
    assert problem.startswith(f"model.hidden_size: gives a model of {n:.2g} parameters: ")
    assert (
        "bytes of weights, gradients and adamw state in MemoryX (16 bytes a parameter), more than" in problem
    )
    assert problem.endswith("(got 1000000000000)")


def test_parameter_counts_are_exact_beyond_int64(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    p = load_params(small_at(hidden_size=2**33, num_heads=4))
    assert model_def(p).num_params == num_params(p.model) > 2**63


def test_data_and_params_problems_come_together(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    raw = small_at()
    raw["train_input"] |= {"data_processor": "TextFileDataProcessor", "data_dir": str(tmp_path / "nope")}
    raw["runconfig"]["max_steps"] = -1
    assert [q.split(":")[0] for q in _problems(raw)] == ["runconfig.max_steps", "train_input.data_dir"]


def _checkpoint(model_dir: Path, step: int) -> None:
    d = model_dir / f"checkpoint_{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}), encoding="utf-8")


def test_a_finished_run_is_recognised_from_its_newest_checkpoint(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    p = load_params(small_at())
    assert finished_step(p) is None
    _checkpoint(tmp_path / "model_dir", 2)
    assert finished_step(p) is None  # 2 of 4 steps: a run resumes
    _checkpoint(tmp_path / "model_dir", 4)
    assert finished_step(p) == 4
    p = load_params(
        small_at()
        | {
            "runconfig": {
                "max_steps": 4,
                "model_dir": str(tmp_path / "model_dir"),
                "autoload_last_checkpoint": False,
            }
        }
    )
    assert finished_step(p) is None  # starts over


def test_a_model_too_deep_names_its_depth(tmp_path: Path, small_at: Small) -> None:
    # one layer of this width fits anywhere: the number of layers is what to change
    (problem,) = _problems(small_at(num_hidden_layers=10**9))
    assert problem.startswith("model.num_hidden_layers: gives a model of ")
    assert problem.endswith("(got 1000000000)")


def test_a_cross_section_problem_does_not_hide_the_data(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    raw = small_at()
    raw["train_input"] |= {"data_processor": "TextFileDataProcessor", "data_dir": str(tmp_path / "nope")}
    raw["runconfig"]["num_csx"] = 3  # batch_size 8 cannot be split over 3 workers
    assert [q.split(":")[0] for q in _problems(raw)] == ["train_input.batch_size", "train_input.data_dir"]


def test_data_is_not_opened_without_the_keys_it_needs(
    tmp_path: Path, small_at: Callable[..., dict[str, Any]]
) -> None:
    raw = small_at()
    raw["train_input"] = {
        "data_processor": "TextFileDataProcessor",
        "data_dir": str(tmp_path),
        "batch_size": 8,
    }
    raw["runconfig"]["max_steps"] = -1  # reported with the length left out, rather than a crash
    assert [q.split(":")[0] for q in _problems(raw)] == [
        "runconfig.max_steps",
        "train_input.max_sequence_length",
    ]

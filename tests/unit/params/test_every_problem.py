"""One validation reports every problem: a key pydantic refuses does not hide the checks across
sections, which then see a stand-in for it and say nothing about it."""

from __future__ import annotations

from typing import Any

import pytest

from weightstream.params import Params, ParamsError, Problem, load_params, read_params


def _problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ParamsError) as e:
        load_params(raw)
    return [str(q) for q in e.value.problems]


def test_a_refused_required_key_does_not_hide_a_cross_check(small: dict[str, Any]) -> None:
    small["train_input"]["batch_size"] = -3
    small["model"]["num_heads"] = 5
    assert _problems(small) == [
        "train_input.batch_size: Input should be greater than 0 (got -3)",
        "model.hidden_size: must be divisible by model.num_heads=5 (got 32)",
    ]


def test_a_check_that_speaks_of_a_refused_key_is_left_out(small: dict[str, Any]) -> None:
    # micro_batch_size 3 does not divide a shard of the stand-in batch_size (1): nothing is said of a
    # batch the user did not write
    small["train_input"]["batch_size"] = "many"
    small["train_input"]["micro_batch_size"] = 3
    assert [q.split(":")[0] for q in _problems(small)] == ["train_input.batch_size"]


def test_later_checks_see_the_stand_in_params(small: dict[str, Any]) -> None:
    seen: list[Params] = []

    def resolve(p: Params) -> tuple[Params, list[Problem]]:
        seen.append(p)
        return p, [Problem("train_input.data_dir", "is not a directory", "./nope")]

    small["runconfig"]["max_steps"] = 0
    with pytest.raises(ParamsError) as e:
        read_params(small, resolve=resolve)
    assert [q.path for q in e.value.problems] == ["runconfig.max_steps", "train_input.data_dir"]
    assert len(seen) == 1

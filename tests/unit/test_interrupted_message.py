"""What ``weightstream run`` says on Ctrl-C: which checkpoint is intact and how many steps were lost,
or that none was written, and how to checkpoint more often."""

from __future__ import annotations

from typing import Any

import pytest

from weightstream.console import interrupted_message
from weightstream.params import load_params


@pytest.fixture
def raw(small: dict[str, Any]) -> dict[str, Any]:
    small["runconfig"] = {"max_steps": 400, "model_dir": "md"}
    return small


def test_no_checkpoint_says_every_step_is_lost_and_how_to_keep_them(raw: dict[str, Any]) -> None:
    text = interrupted_message(load_params(raw), 57, None)
    assert "intact" not in text
    assert (
        "No checkpoint was written (checkpoints come only at the end), so the 57 steps trained are lost"
        in text
    )
    assert "set checkpoint_steps (runconfig.checkpoint_steps, or trainer.init.checkpoint.steps)" in text


def test_a_checkpoint_says_where_it_resumes_and_what_was_lost(raw: dict[str, Any]) -> None:
    p = load_params(raw | {"runconfig": {**raw["runconfig"], "checkpoint_steps": 50}})
    text = interrupted_message(p, 57, 50)
    assert "The checkpoint of step 50 in md is intact: `weightstream run` again resumes from it" in text
    assert "the 7 steps after it are lost" in text
    assert "lost" not in interrupted_message(p, 50, 50)

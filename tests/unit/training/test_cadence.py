"""When a run logs, evaluates and checkpoints: the one rule both trainers follow."""

from __future__ import annotations

import json

from tests.params_files import TINY
from weightstream.params import load_params
from weightstream.training.cadence import Cadence


def _cadence(eval_input: bool = True, **runconfig: int) -> Cadence:
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(runconfig)
    if not eval_input:
        del raw["eval_input"]
    return Cadence.of(load_params(raw))


def test_every_n_and_always_after_the_last_step() -> None:
    c = _cadence(max_steps=10, log_steps=3, eval_frequency=4, checkpoint_steps=5)
    steps = range(1, 11)
    assert [s for s in steps if c.log(s)] == [3, 6, 9, 10]
    assert [s for s in steps if c.evaluate(s)] == [4, 8, 10]
    assert [s for s in steps if c.checkpoint(s)] == [5, 10]


def test_zero_means_only_at_the_end() -> None:
    c = _cadence(max_steps=6, log_steps=1, eval_frequency=0, checkpoint_steps=0)
    assert [s for s in range(1, 7) if c.evaluate(s)] == [6]
    assert [s for s in range(1, 7) if c.checkpoint(s)] == [6]
    assert all(c.log(s) for s in range(1, 7))


def test_no_eval_input_no_evaluation() -> None:
    c = _cadence(eval_input=False, max_steps=4, eval_frequency=0)
    assert not any(c.evaluate(s) for s in range(1, 5))

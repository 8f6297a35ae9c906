"""The shipped examples: each checkpoints often enough that Ctrl-C loses little training."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.params import read_params

EXAMPLES = sorted((Path(__file__).parents[2] / "services" / "weightstream" / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_sets_a_checkpoint_interval(example: Path) -> None:
    # without one a run checkpoints only at its end, and Ctrl-C loses every step; the intervals are
    # chosen from each example's step rate on a 2-core machine (about a minute of training at most)
    rc = read_params(example).params.runconfig
    assert 0 < rc.checkpoint_steps < rc.max_steps

"""Where a run stands (training/run_state.py): committing steps, replaying them after a rollback with each
loss checked against its first run, and moving the recovery point."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.training.errors import JobFailed
from weightstream.training.records import StepRecord
from weightstream.training.run_state import RunState


def _record(step: int, loss: float, workers: int = 1) -> StepRecord:
    return StepRecord(step, loss, 1e-3, 1.0, 100, 0.5, 0.0, 0.4, 0.1, 0, 0, workers)


def test_a_fresh_run_writes_checkpoint_0_first_a_resumed_one_does_not() -> None:
    fresh = RunState.begin(0, None, initial_checkpoint=True)
    assert (fresh.at, fresh.done, fresh.post, fresh.recovery_point) == (0, 0, ["checkpoint"], (0, None))
    assert RunState.begin(0, None, initial_checkpoint=False).post == []
    resumed = RunState.begin(4, Path("checkpoint_4"), initial_checkpoint=True)
    assert (resumed.at, resumed.done, resumed.post) == (4, 4, [])
    assert resumed.recovery_point == (4, Path("checkpoint_4"))


def test_committed_steps_count_their_tokens_and_losses() -> None:
    state = RunState.begin(0, None, initial_checkpoint=False)
    state.t_train -= 2.0  # training began 2 s ago
    tokens_per_second = state.commit(_record(1, 4.5))
    assert 0 < tokens_per_second <= 100 / 2.0
    state.commit(_record(2, 4.25))
    assert (state.at, state.done, state.tokens, state.last_loss) == (2, 2, 200, 4.25)
    assert state.losses == {0: 4.5, 1: 4.25} and not state.replaying


def test_a_replay_must_give_the_losses_of_the_first_run() -> None:
    state = RunState.begin(0, None, initial_checkpoint=False)
    for step, loss in ((1, 4.5), (2, 4.25), (3, 4.0)):
        state.commit(_record(step, loss))
    state.at = 0  # a shard was lost: every shard went back to the seed's weights
    assert state.replaying
    state.replayed(_record(1, 4.5))
    assert state.at == 1 and state.replaying
    with pytest.raises(
        JobFailed, match=r"step 2 replayed after a fault gave loss 4\.375, its first run 4\.25"
    ):
        state.replayed(_record(2, 4.375))


def test_a_step_replayed_with_another_number_of_workers_need_agree_only_to_rounding() -> None:
    """Elastic workers: a step first run with 3 workers and replayed with 2 (or back) sums its gradients in
    another split: its loss agrees to rounding, and only a real difference fails the job."""
    state = RunState.begin(0, None, initial_checkpoint=False)
    state.commit(_record(1, 4.5, workers=3))
    state.commit(_record(2, 4.25, workers=3))
    state.at = 0
    state.replayed(_record(1, 4.5 * (1 + 1e-8), workers=2))
    with pytest.raises(
        JobFailed, match=r"step 2 replayed after a fault with 2 workers .* its first run with 3"
    ):
        state.replayed(_record(2, 4.375, workers=2))


def test_a_new_recovery_point_forgets_the_losses_before_it() -> None:
    state = RunState.begin(0, None, initial_checkpoint=False)
    for step in (1, 2, 3):
        state.commit(_record(step, 5.0 - step))
    state.new_recovery_point(Path("recovery_3"))
    assert state.recovery_point == (3, Path("recovery_3")) and state.losses == {}
    state.commit(_record(4, 0.5))
    assert state.losses == {3: 0.5}


def test_a_misspelled_field_is_an_error_not_a_new_attribute() -> None:
    state = RunState.begin(0, None, initial_checkpoint=False)
    with pytest.raises(AttributeError):
        state.eval_los = 1.0  # type: ignore[attr-defined]  # the misspelling under test

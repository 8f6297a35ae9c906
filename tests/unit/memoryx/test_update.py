"""The step's calls and the optimizer applied (memoryx/update.py) alone, without the serving piece: what the
update announces as it goes, what it forgets, and the step and generation it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.memoryx_shards import WAIT_S, tiny_state
from weightstream.memoryx.errors import StaleStepError
from weightstream.memoryx.gradients import StepGradients
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.serving import ChecksumCache
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.store import MemoryStore
from weightstream.memoryx.update import ShardUpdate
from weightstream.transport.fencing import StaleGenerationError
from weightstream.transport.tensors import checksum


def _update() -> tuple[ShardUpdate, ShardState]:
    state = tiny_state(MemoryStore())
    state.fill(seed=7)
    progress = ShardProgress(WAIT_S)
    return ShardUpdate(state, progress, StepGradients(state), ChecksumCache()), state


def _all_in(update: ShardUpdate, state: ShardState, step: int, generation: int = 0) -> None:
    rng = np.random.default_rng(step)
    for u, unit in enumerate(state.model.units):
        grads = {n: rng.standard_normal(state.shape(n)).astype(np.float32) for n in unit.param_names}
        update.add_gradient(step, u, grads, generation)


def test_each_tensor_is_announced_in_the_models_order_as_its_update_is_done() -> None:
    update, state = _update()
    progress, checksums = update.progress, update.checksums
    checksums.of([(n, state.weight(n)) for n in state.names])
    announced: list[tuple[str, bool]] = []
    original = progress.updated

    def recorded(name: str) -> None:
        w = state.weight(name)  # announced once updated, its old checksum already forgotten
        announced.append((name, checksums.of([(name, w)])[name] == checksum(w.reshape(-1).view(np.uint8))))
        original(name)

    progress.updated = recorded  # type: ignore[method-assign]  # this instance's, for the test
    before = {n: state.weight(n).copy() for n in state.names}
    _all_in(update, state, 0)
    assert update.apply_update(0, lr=1e-2, clip_coef=1.0)
    assert [n for n, _ in announced] == list(state.names)  # the embedding first
    assert all(current for _, current in announced)
    assert progress.step == 1 and progress.updating is None and not progress.fresh
    assert not any(update.gradients.pending.values()) and update.gradients.sq_sum is None
    assert any(not np.array_equal(before[n], state.weight(n)) for n in state.names)
    assert not update.apply_update(0, lr=1e-2, clip_coef=1.0)  # applied already: nothing happens


def test_calls_of_another_step_or_generation_are_refused() -> None:
    update, state = _update()
    update.progress.generation = 1
    with pytest.raises(StaleGenerationError):
        update.add_gradient(0, 0, {}, generation=0)
    with pytest.raises(StaleStepError, match="gradient of step 1 for unit 0, shard is at step 0"):
        update.add_gradient(1, 0, {}, generation=1)
    with pytest.raises(StaleStepError, match="norm of step 2 requested"):
        update.grad_sq_sum(2, generation=1)
    with pytest.raises(StaleStepError, match="update of step 3 requested"):
        update.apply_update(3, 1e-2, 1.0, generation=1)
    _all_in(update, state, 0, generation=1)
    assert update.grad_sq_sum(0, generation=1) == update.gradients.sq_sum
    with pytest.raises(StaleGenerationError):
        update.apply_update(0, 1e-2, 1.0, generation=2)
    assert update.apply_update(0, 1e-2, 1.0, generation=1)
    with pytest.raises(StaleGenerationError):  # refused, not told it was applied
        update.apply_update(0, 1e-2, 1.0, generation=0)

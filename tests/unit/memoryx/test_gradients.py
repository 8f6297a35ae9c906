"""A step's gradients alone (memoryx/gradients.py), on a shard's state in either store: no lock, no shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.memoryx_shards import tiny_state
from weightstream.memoryx.gradients import StepGradients
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.store import DiskStore, MemoryStore, TensorStore
from weightstream.numerics.optim import grad_sq_sum

WTE = "transformer.wte.weight"  # tied: the embedding's unit and the head's send it a gradient each


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TensorStore:
    return MemoryStore() if request.param == "memory" else DiskStore(tmp_path / "mx")


def _grads(state: ShardState, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {n: rng.standard_normal(state.shape(n)).astype(np.float32) for n in unit.param_names}
        for unit in state.model.units
    ]


def test_the_sum_of_squares_is_of_the_parts_added_in_unit_order_whatever_the_arrival(
    store: TensorStore,
) -> None:
    state = tiny_state(store)
    assert state.users[WTE] == (0, len(state.model.units) - 1)
    grads = _grads(state, 1)
    expected = 0.0
    for n in state.names:
        parts = [g[n] for g in grads if n in g]
        whole = parts[0].copy()
        for p in parts[1:]:
            whole += p
        expected += grad_sq_sum(whole)
    gradients = StepGradients(state)
    for u in reversed(range(len(grads))):  # backward's order: the embedding's part last
        assert not gradients.complete()
        gradients.add(0, u, {n: g.copy() for n, g in grads[u].items()})
    assert gradients.complete() and gradients.missing() == {}
    # in RAM each complete tensor was summed in the background as it completed; on disk nothing runs
    assert len(gradients.sq_parts) == (len(state.names) if store.resident else 0)
    assert gradients.total() == expected and gradients.sq_sum == expected
    assert gradients.key(WTE) == f"{WTE}.grad" and gradients.key("transformer.ln_f.bias").endswith(".grad.3")
    gradients.close()
    store.close()


def test_a_unit_s_gradients_are_taken_all_or_none(store: TensorStore) -> None:
    state = tiny_state(store)
    gradients = StepGradients(state)
    grads = _grads(state, 2)[1]
    good, bad = sorted(grads)[:2]
    with pytest.raises(ValueError, match=f"gradient of '{bad}' has shape"):
        gradients.add(0, 1, {good: grads[good], bad: grads[bad][:1]})
    assert not gradients.pending[good] and f"{good}.grad.1" not in store  # the good one not taken either
    with pytest.raises(ValueError, match=f"unit 2 does not use '{good}'"):
        gradients.add(0, 2, {good: grads[good]})
    with pytest.raises(KeyError, match="which this shard does not hold"):
        gradients.add(0, 1, {"elsewhere": grads[good]})
    gradients.add(0, 1, grads)
    with pytest.raises(ValueError, match="arrived twice in step 5"):
        gradients.add(5, 1, {good: grads[good]})
    assert gradients.missing()[WTE] == [0, 3]
    gradients.close()
    store.close()


def test_dropped_gradients_leave_only_what_the_store_recycles(store: TensorStore) -> None:
    state = tiny_state(store)
    gradients = StepGradients(state)
    for u, g in enumerate(_grads(state, 3)):
        gradients.add(0, u, g)
    gradients.total()
    gradients.drop()
    assert gradients.sq_sum is None and not gradients.sq_parts and not any(gradients.pending.values())
    left = [k for k in store.shapes if ".grad" in k]
    # the tied tensor's sum is kept in RAM for the next step (no new allocation); its file goes on disk
    assert left == ([f"{WTE}.grad"] if store.resident else [])
    gradients.close()
    store.close()

"""Closing a MemoryX shard (its role stopping, or a new configuration replacing it) wakes every call
waiting in it: a gRPC handler left waiting out its timeout (120 s by default) held a stopped MemoryX
process alive after its coordinator died. An update being applied still finishes before the store goes."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.memoryx_shards import WAIT_S, gate, gradients_in, in_thread, tiny_shard
from weightstream.memoryx.shard import ShardClosedError
from weightstream.memoryx.store import MemoryStore


def _raised(fn: Callable[[], object]) -> tuple[list[BaseException], Callable[[], None]]:
    """``fn`` wrapped to record what it raises instead of raising it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # the test inspects it
            errors.append(e)

    return errors, run


def test_close_wakes_the_calls_waiting_for_gradients_and_for_weights() -> None:
    shard, model = tiny_shard(timeout_s=60)  # a wait not woken by close would outlast the joins by far
    # only unit 0's gradients are in: the update waits for the others, the next step's weights for it
    grads = {n: np.ones(shard.held.shape(n), np.float32) for n in model.units[0].param_names}
    shard.add_gradient(0, 0, grads)
    waiting = {
        "update": lambda: shard.apply_update(0, 1e-2, 1.0),
        "norm": lambda: shard.grad_sq_sum(0),
        "weights": lambda: shard.tensors(1, list(model.units[-1].param_names)),
    }
    threads = {}
    for what, fn in waiting.items():
        errors, run = _raised(fn)
        threads[what] = (in_thread(run)[0], errors)
    assert shard.progress.wait_for_waiters(len(threads), WAIT_S), "the calls must be waiting before the close"
    t0 = time.monotonic()
    shard.close()
    for what, (t, errors) in threads.items():
        t.join(WAIT_S)
        assert not t.is_alive(), f"{what}: still waiting after the shard closed"
        assert len(errors) == 1 and isinstance(errors[0], ShardClosedError), (what, errors)
    assert time.monotonic() - t0 < WAIT_S
    with pytest.raises(ShardClosedError):  # and a call arriving after the close fails at once too
        shard.tensors(1, list(model.units[0].param_names))


def test_close_lets_an_update_being_applied_finish_before_freeing_the_store() -> None:
    shard, model = tiny_shard()
    gradients_in(shard, model, 0)
    late = model.units[-2].param_names[0]
    reached, go = gate(shard, late)
    updater, applied = in_thread(lambda: shard.apply_update(0, 1e-2, 1.0))
    assert reached.wait(WAIT_S)
    closer, _ = in_thread(shard.close)
    assert shard.progress.wait_for_waiters(1, WAIT_S), "the close must wait for the update in progress"
    assert isinstance(shard.store, MemoryStore)
    assert shard.store.arrays, "the store was freed under an update in progress"
    go.set()
    for t in (updater, closer):
        t.join(WAIT_S)
    assert applied == [True] and shard.step == 1
    assert not shard.store.arrays  # freed once the update was done

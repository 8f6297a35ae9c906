"""A MemoryX shard in memory mode computes each tensor's sum of squares as soon as its gradient is complete
(memoryx/gradients.py), a tied tensor's parts added first, so the norm at the end of a step only adds what
arrived last; its bits are those of the sum over every gradient in the tensors' order, whatever the arrival
order or the store."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.memoryx_shards import tiny_shard
from weightstream.memoryx import grad_sums
from weightstream.memoryx.shard import MemoryXShard
from weightstream.numerics.optim import grad_sq_sum


def _grads(model: Any, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {n: rng.standard_normal(model.specs[n].shape).astype(np.float32) for n in unit.param_names}
        for unit in model.units
    ]


def _feed(
    shard: MemoryXShard, step: int, grads: list[dict[str, np.ndarray]], order: list[int], generation: int = 0
) -> None:
    for u in order:
        shard.add_gradient(step, u, {n: g.copy() for n, g in grads[u].items()}, generation)


def test_the_norm_has_the_same_bits_whatever_the_arrival_order_and_the_store(tmp_path: Path) -> None:
    model = tiny_shard()[1]
    grads = _grads(model, 3)
    units = list(range(len(model.units)))
    expected = 0.0  # every tensor's whole gradient (a tied one's parts added in unit order), in order
    for n in model.specs:
        parts = [grads[u][n] for u in units if n in grads[u]]
        whole = parts[0].copy()
        for p in parts[1:]:
            whole += p
        expected += grad_sq_sum(whole)
    sums = []
    for storage, order in ((None, units), (None, units[::-1]), (tmp_path / "disk", units)):
        shard, _ = tiny_shard(storage=storage)
        _feed(shard, 0, grads, order)
        sums.append(shard.grad_sq_sum(0))
        shard.close()
    assert sums == [expected] * 3


def test_each_complete_gradient_is_summed_in_the_background_before_the_norm_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tied embedding's parts too: its last part (the embedding's, the last of backward) starts the
    addition and its sum of squares, before anybody asks for the norm. Its sum is then the parts added in
    unit order, bitwise, and the parts are let go once the norm is taken."""
    shard, model = tiny_shard()
    done: list[str] = []  # the thread each sum of squares ran in
    original = grad_sums.sq_sum_of

    def recorded(blocks: Any) -> float:
        out = original(blocks)
        done.append(threading.current_thread().name)
        return out

    monkeypatch.setattr(grad_sums, "sq_sum_of", recorded)
    users = {n: [u for u, unit in enumerate(model.units) if n in unit.param_names] for n in model.specs}
    tied = [n for n, us in users.items() if len(us) > 1]
    assert tied  # TINY ties its embedding: one tensor has two units' parts
    grads = _grads(model, 4)
    _feed(shard, 0, grads, list(range(len(model.units))))
    running = list(shard.gradients.sq_parts.values())  # nobody has asked for the norm yet
    assert len(running) == len(users) and not futures.wait(running, timeout=10).not_done
    assert len(done) == len(users) and all(t.startswith("memoryx-norm") for t in done)
    for n in tied:
        want = grads[users[n][0]][n].copy()
        for u in users[n][1:]:
            want += grads[u][n]
        np.testing.assert_array_equal(shard.store.get(f"{n}.grad"), want)
    shard.grad_sq_sum(0)
    assert len(done) == len(users)  # nothing summed again when asked
    assert not [k for n in tied for k in shard.store.shapes if k.startswith(f"{n}.grad.")]
    shard.close()


def test_sums_of_an_interrupted_step_are_not_used_after_a_reset() -> None:
    shard, model = tiny_shard()
    order = list(range(len(model.units)))
    _feed(shard, 0, _grads(model, 5), order)  # the attempt a fault interrupts
    shard.reset(1)
    again = _grads(model, 6)
    _feed(shard, 0, again, order, generation=1)
    fresh, _ = tiny_shard()
    _feed(fresh, 0, again, order)
    assert shard.grad_sq_sum(0, generation=1) == fresh.grad_sq_sum(0)
    shard.close()
    fresh.close()

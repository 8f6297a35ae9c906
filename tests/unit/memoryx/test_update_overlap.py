"""A MemoryX shard serves each tensor of the next step as soon as its update is done (memoryx/shard.py),
so the workers' next forward overlaps the rest of the update; everything else waits for the whole of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.integration.appliance import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs
from weightstream.transport.tensors import checksum


def _shard(raw: dict[str, Any] = TINY) -> tuple[MemoryXShard, Any]:
    p = load_params(raw)
    model = model_def(p)
    specs = sparsity_specs(p, model) if p.sparsity is not None else None
    opt = optimizer_config(p.optimizer)
    return MemoryXShard(model, opt, list(model.specs), seed=7, timeout_s=10, sparsity=specs), model


def _gradients_in(shard: MemoryXShard, model: Any, step: int) -> None:
    rng = np.random.default_rng(step)
    for u, unit in enumerate(model.units):
        grads = {}
        for n in unit.param_names:
            shape = shard._shape(n)  # compact where sparse, as a worker sends it
            grads[n] = rng.standard_normal(shape).astype(np.float32)
        shard.add_gradient(step, u, grads)


def _gate(shard: MemoryXShard, name: str) -> tuple[threading.Event, threading.Event]:
    """Make the shard's update stop before tensor ``name`` until ``go`` is set (``reached`` says it is
    there)."""
    reached, go = threading.Event(), threading.Event()
    update: Callable[..., None] = shard.store.update

    def gated(keys: list[str], fn: Any, write: list[str]) -> None:
        if keys[0] == name:
            reached.set()
            assert go.wait(10)
        update(keys, fn, write)

    shard.store.update = gated  # type: ignore[method-assign]
    return reached, go


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_updated_tensors_are_served_while_the_rest_of_the_update_runs() -> None:
    shard, model = _shard()
    clean, _ = _shard()  # the same step without any overlap: what the served weights must equal
    for s in (shard, clean):
        _gradients_in(s, model, 0)
    assert clean.apply_update(0, 1e-2, 0.5)
    first = list(model.units[0].param_names)  # the embedding: updated first
    last = list(model.units[-1].param_names)
    late = next(n for n in model.specs if n in model.units[-2].param_names)
    reached, go = _gate(shard, late)
    updater, applied = _in_thread(lambda: shard.apply_update(0, 1e-2, 0.5))
    assert reached.wait(10)
    # the embedding of step 1, while the update is held before the last block
    got = dict(shard.tensors(1, first))
    for n in first:
        assert np.array_equal(got[n], dict(clean.tensors(1, [n]))[n])
    assert shard.served_early == len(first)
    assert shard.step == 0
    # a tensor not updated yet waits; and so do the next step's gradients
    reader, read = _in_thread(lambda: dict(shard.tensors(1, [late])))
    pusher, pushed = _in_thread(lambda: _gradients_in(shard, model, 1))
    time.sleep(0.3)
    assert reader.is_alive() and pusher.is_alive()
    go.set()
    for t in (updater, reader, pusher):
        t.join(10)
    assert applied == [True] and shard.step == 1
    assert np.array_equal(read[0][late], dict(clean.tensors(1, [late]))[late])
    assert pushed == [None]  # accepted as step 1's, not refused as a stale step
    assert np.array_equal(dict(shard.tensors(1, last))[last[0]], dict(clean.tensors(1, last))[last[0]])


def test_a_repeated_update_and_a_reset_wait_for_the_update_in_flight() -> None:
    shard, model = _shard()
    late = model.units[-2].param_names[0]
    for step, interloper in ((0, "retry"), (1, "reset")):
        _gradients_in(shard, model, step)
        reached, go = _gate(shard, late)
        updater, _ = _in_thread(lambda step=step: shard.apply_update(step, 1e-2, 1.0))
        assert reached.wait(10)
        if interloper == "retry":  # the same call again (a retry): finds the step applied
            other, out = _in_thread(lambda: shard.apply_update(0, 1e-2, 1.0))
        else:  # a fault elsewhere: the gradients of the next attempt start from whole weights
            other, out = _in_thread(lambda: shard.reset(1))
        time.sleep(0.3)
        assert other.is_alive(), f"a {interloper} cut into a half-applied update"
        go.set()
        for t in (updater, other):
            t.join(10)
        assert shard.step == step + 1
        assert out == ([False] if interloper == "retry" else [None])
        shard.store.update = type(shard.store).update.__get__(shard.store)  # ungated
    assert shard.generation == 1


def test_a_step_that_makes_masks_again_serves_nothing_before_its_end() -> None:
    """gmp: after an update step the masks are made again from the new weights, so a weight is final
    only at the end of the whole update."""
    raw = {
        **TINY,
        "sparsity": {
            "algorithm": "gmp",
            "init_method": "topk",
            "sparsity": {"type": "linear", "init": 0.0, "slope": 0.1},
            "update": {"freq": 1},
        },
    }
    shard, model = _shard(raw)
    assert shard.sparse.due(1), "the test needs a mask update after step 1"
    _gradients_in(shard, model, 0)
    late = model.units[-2].param_names[0]
    reached, go = _gate(shard, late)
    updater, _ = _in_thread(lambda: shard.apply_update(0, 1e-2, 1.0))
    assert reached.wait(10)
    reader, _ = _in_thread(lambda: shard.tensors(1, list(model.units[0].param_names)))
    time.sleep(0.3)
    assert reader.is_alive() and shard.served_early == 0
    go.set()
    for t in (updater, reader):
        t.join(10)
    assert shard.step == 1


def test_weights_of_a_step_already_passed_are_refused() -> None:
    shard, model = _shard()
    _gradients_in(shard, model, 0)
    shard.apply_update(0, 1e-2, 1.0)
    with pytest.raises(ValueError, match="weights of step 0 requested, shard is at step 1"):
        shard.tensors(0, list(model.units[0].param_names))


def test_checksums_sent_with_the_next_steps_weights_are_of_the_updated_values() -> None:
    """The shard caches each weight's checksum for the step's two passes; an updated tensor's cached
    checksum must go with its update, or a worker would reject the new weights."""
    shard, model = _shard()
    names = list(model.specs)
    before = shard.checksums(shard.tensors(0, names))
    _gradients_in(shard, model, 0)
    shard.apply_update(0, 1e-2, 1.0)
    after = shard.tensors(1, names)
    sent = shard.checksums(after)
    for n, w in after:
        assert sent[n] == checksum(w.reshape(-1).view(np.uint8))
    assert any(sent[n] != before[n] for n in names)

"""A MemoryX shard serves each tensor of the next step as soon as its update is done (memoryx/update.py,
serving.py), so the workers' next forward overlaps the rest of the update; everything else waits for the
whole of it."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from tests.memoryx_shards import WAIT_S, gate, gradients_in, in_thread, tiny_shard
from tests.params_files import TINY
from weightstream.transport.tensors import checksum


def test_updated_tensors_are_served_while_the_rest_of_the_update_runs() -> None:
    shard, model = tiny_shard()
    clean, _ = tiny_shard()  # the same step without any overlap: what the served weights must equal
    for s in (shard, clean):
        gradients_in(s, model, 0)
    assert clean.apply_update(0, 1e-2, 0.5)
    first = list(model.units[0].param_names)  # the embedding: updated first
    last = list(model.units[-1].param_names)
    late = next(n for n in model.specs if n in model.units[-2].param_names)
    reached, go = gate(shard, late)
    updater, applied = in_thread(lambda: shard.apply_update(0, 1e-2, 0.5))
    assert reached.wait(WAIT_S)
    # the embedding of step 1, while the update is held before the last block
    got = dict(shard.tensors(1, first))
    for n in first:
        assert np.array_equal(got[n], dict(clean.tensors(1, [n]))[n])
    assert shard.served_early == len(first)
    assert shard.step == 0
    # a tensor not updated yet waits; and so do the next step's gradients
    reader, read = in_thread(lambda: dict(shard.tensors(1, [late])))
    pusher, pushed = in_thread(lambda: gradients_in(shard, model, 1))
    assert shard.progress.wait_for_waiters(2, WAIT_S), "the reader and the pusher must wait for the update"
    assert read == [] and pushed == [] and shard.served_early == len(first)
    go.set()
    for t in (updater, reader, pusher):
        t.join(WAIT_S)
    assert applied == [True] and shard.step == 1
    assert np.array_equal(read[0][late], dict(clean.tensors(1, [late]))[late])
    assert pushed == [None]  # accepted as step 1's, not refused as a stale step
    assert np.array_equal(dict(shard.tensors(1, last))[last[0]], dict(clean.tensors(1, last))[last[0]])


def test_a_repeated_update_and_a_reset_wait_for_the_update_in_flight() -> None:
    shard, model = tiny_shard()
    late = model.units[-2].param_names[0]
    for step, interloper in ((0, "retry"), (1, "reset")):
        gradients_in(shard, model, step)
        reached, go = gate(shard, late)
        updater, _ = in_thread(partial(shard.apply_update, step, 1e-2, 1.0))
        assert reached.wait(WAIT_S)
        if interloper == "retry":  # the same call again (a retry): finds the step applied
            other, out = in_thread(lambda: shard.apply_update(0, 1e-2, 1.0))
        else:  # a fault elsewhere: the gradients of the next attempt start from whole weights
            other, out = in_thread(lambda: shard.reset(1))
        assert shard.progress.wait_for_waiters(1, WAIT_S), f"a {interloper} cut into a half-applied update"
        assert out == []
        go.set()
        for t in (updater, other):
            t.join(WAIT_S)
        assert shard.step == step + 1
        assert out == ([False] if interloper == "retry" else [None])
        shard.store.update = type(shard.store).update.__get__(shard.store)  # type: ignore[method-assign]  # ungated
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
    shard, model = tiny_shard(raw)
    assert shard.sparse.due(1), "the test needs a mask update after step 1"
    gradients_in(shard, model, 0)
    late = model.units[-2].param_names[0]
    reached, go = gate(shard, late)
    updater, _ = in_thread(lambda: shard.apply_update(0, 1e-2, 1.0))
    assert reached.wait(WAIT_S)
    reader, _ = in_thread(lambda: shard.tensors(1, list(model.units[0].param_names)))
    assert shard.progress.wait_for_waiters(1, WAIT_S), "a weight was served before the masks were made"
    assert shard.served_early == 0
    go.set()
    for t in (updater, reader):
        t.join(WAIT_S)
    assert shard.step == 1


def test_weights_of_a_step_already_passed_are_refused() -> None:
    shard, model = tiny_shard()
    gradients_in(shard, model, 0)
    shard.apply_update(0, 1e-2, 1.0)
    with pytest.raises(ValueError, match="weights of step 0 requested, shard is at step 1"):
        shard.tensors(0, list(model.units[0].param_names))


def test_checksums_sent_with_the_next_steps_weights_are_of_the_updated_values() -> None:
    """The shard caches each weight's checksum for the step's two passes; an updated tensor's cached
    checksum must go with its update, or a worker would reject the new weights."""
    shard, model = tiny_shard()
    names = list(model.specs)
    before = shard.checksums(shard.tensors(0, names))
    gradients_in(shard, model, 0)
    shard.apply_update(0, 1e-2, 1.0)
    after = shard.tensors(1, names)
    sent = shard.checksums(after)
    for n, w in after:
        assert sent[n] == checksum(w.reshape(-1).view(np.uint8))
    assert any(sent[n] != before[n] for n in names)

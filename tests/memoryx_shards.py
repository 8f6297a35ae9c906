"""MemoryX shards for the tests of memoryx/: a shard of the TINY model (or its state alone, in a store of the
test's choice), a step's gradients into it, a gate that holds its update before a tensor, and a call run in
a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.store import TensorStore
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs

# what a test waits at most for a call to block or a thread to end (a pass takes milliseconds)
WAIT_S = 10.0


def tiny_shard(raw: dict[str, Any] = TINY, timeout_s: float = 10) -> tuple[MemoryXShard, Any]:
    """A memory-mode shard holding every tensor of ``raw``'s model (sparse if it says so), and the model."""
    p = load_params(raw)
    model = model_def(p)
    specs = sparsity_specs(p, model) if p.sparsity is not None else None
    opt = optimizer_config(p.optimizer)
    return MemoryXShard(model, opt, list(model.specs), seed=7, timeout_s=timeout_s, sparsity=specs), model


def tiny_state(store: TensorStore, raw: dict[str, Any] = TINY) -> ShardState:
    """The state of a shard holding every tensor of ``raw``'s model in ``store``, empty (``fill``: filled)."""
    p = load_params(raw)
    model = model_def(p)
    specs = sparsity_specs(p, model) if p.sparsity is not None else None
    return ShardState(model, optimizer_config(p.optimizer), list(model.specs), store, specs)


def gradients_in(shard: MemoryXShard, model: Any, step: int) -> None:
    """Every unit's gradients of ``step`` (random, seeded by the step) into ``shard``, unit by unit."""
    rng = np.random.default_rng(step)
    for u, unit in enumerate(model.units):
        grads = {}
        for n in unit.param_names:
            shape = shard.held.shape(n)  # compact where sparse, as a worker sends it
            grads[n] = rng.standard_normal(shape).astype(np.float32)
        shard.add_gradient(step, u, grads)


def gate(shard: MemoryXShard, name: str) -> tuple[threading.Event, threading.Event]:
    """Make the shard's update stop before tensor ``name`` until ``go`` is set (``reached`` says it is
    there)."""
    reached, go = threading.Event(), threading.Event()
    update: Callable[..., None] = shard.store.update

    def gated(keys: Sequence[str], fn: Callable[[list[np.ndarray]], None], write: Sequence[str]) -> None:
        if keys[0] == name:
            reached.set()
            assert go.wait(WAIT_S)
        update(keys, fn, write)

    shard.store.update = gated  # type: ignore[method-assign]  # the instance's, for this test only
    return reached, go


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``fn`` started in a thread of its own; the list gets what it returns."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out

"""Weights going out (memoryx/serving.py) alone, over a shard's state and a progress driven by hand: what
the update announces is served early, the rest waits; checksums are computed once per update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.memoryx_shards import WAIT_S, in_thread, tiny_state
from tests.params_files import TINY
from weightstream.memoryx import serving as serving_module
from weightstream.memoryx.errors import StaleStepError
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.serving import ChecksumCache, WeightServing
from weightstream.memoryx.store import DiskStore, MemoryStore
from weightstream.transport.shm import SharedArena

WTE, HEAD = "transformer.wte.weight", "transformer.ln_f.weight"


def _serving(timeout_s: float = WAIT_S) -> WeightServing:
    state = tiny_state(MemoryStore())
    state.fill(seed=7)
    return WeightServing(state, ShardProgress(timeout_s))


def test_a_tensor_the_update_has_finished_is_served_early_and_the_others_wait() -> None:
    serving = _serving()
    progress = serving.progress
    with progress:
        progress.begin_update(0)
        progress.updated(WTE)
    assert [n for n, _ in serving.tensors(1, [WTE])] == [WTE] and serving.served_early == 1
    reader, out = in_thread(lambda: serving.tensors(1, [WTE, HEAD]))
    assert progress.wait_for_waiters(1, WAIT_S), "a tensor not updated yet must wait"
    with progress:
        progress.updated(HEAD)
    reader.join(WAIT_S)
    assert [n for n, _ in out[0]] == [WTE, HEAD] and serving.served_early == 3
    with progress:
        progress.step = 1
        progress.end_update()
    serving.tensors(1, [HEAD])
    assert serving.served_early == 3  # the step's weights whole: not early
    with pytest.raises(StaleStepError, match="weights of step 0 requested, shard is at step 1"):
        serving.tensors(0, [HEAD])
    with pytest.raises(KeyError, match="not on this shard"):
        serving.tensors(1, ["elsewhere"])


def test_weights_not_ready_within_the_timeout_are_refused() -> None:
    serving = _serving(timeout_s=0.05)
    with pytest.raises(TimeoutError, match=r"weights of step 1 not ready after 0\.05s"):
        serving.tensors(1, [WTE])


def test_a_sparse_tensor_goes_out_with_its_index_after_its_values(tmp_path: Path) -> None:
    state = tiny_state(DiskStore(tmp_path / "mx"), {**TINY, "sparsity": {"sparsity": 0.75}})
    state.fill(seed=7)
    serving = WeightServing(state, ShardProgress(WAIT_S))
    n = next(iter(state.sparse.specs))
    (name, values), (index, _) = serving.tensors(0, [n])
    assert name == n and values.shape == state.shape(n) and index == state.sparse.index_tensor(n)[0]
    assert not serving.shares_weights
    state.store.close()


def test_the_weights_are_shared_where_the_store_keeps_them_in_an_arena() -> None:
    state = tiny_state(MemoryStore(SharedArena("serving-test"), [WTE]))
    assert WeightServing(state, ShardProgress(WAIT_S)).shares_weights
    state.store.close()


def test_a_checksum_is_computed_once_until_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[int] = []
    original = serving_module.checksum

    def counted(data: Any) -> int:
        computed.append(len(data))
        return original(data)

    monkeypatch.setattr(serving_module, "checksum", counted)
    cache = ChecksumCache()
    a, b = np.arange(3, dtype=np.float32), np.ones(5, np.float32)
    first = cache.of([("a", a), ("b", b)])
    assert cache.of([("b", b), ("a", a)]) == first and computed == [12, 20]
    a += 1
    assert cache.of([("a", a)]) == {"a": first["a"]}  # cached: the update has not said it changed
    cache.forget("a")
    assert cache.of([("a", a)])["a"] != first["a"] and computed == [12, 20, 12]
    cache.clear()
    cache.of([("a", a), ("b", b)])
    assert computed == [12, 20, 12, 12, 20]

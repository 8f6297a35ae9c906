"""A SwarmX node's logic without gRPC (swarmx/node.py): broadcast fetches each unit once for all children and
passes each piece down as it arrives, errors and a stalled upstream reach every child, and the reduction is
exact and in child order whatever the order of arrival."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from tests.swarmx_fakes import FakeUpstream, TrickleUpstream
from weightstream.swarmx.node import SwarmNodeLogic, Unit, sum_in_order


def test_broadcast_fetches_once_per_unit_and_pass_for_all_children() -> None:
    up = FakeUpstream()
    node = SwarmNodeLogic(num_children=8, upstream=up, timeout_s=5)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(lambda: list(node.get_unit(3, 1, 0))) for _ in range(8)]
        up.gate.set()
        results = [f.result() for f in futures]
    assert up.fetches == [(3, 1, 0)]
    assert all(len(r) == 1 and np.array_equal(r[0]["w"], results[0][0]["w"]) for r in results)
    list(node.get_unit(3, 1, 1))  # the backward pass is another broadcast
    assert up.fetches == [(3, 1, 0), (3, 1, 1)]


def test_broadcast_is_cut_through_each_piece_goes_down_as_it_arrives() -> None:
    up = TrickleUpstream()
    node = SwarmNodeLogic(num_children=2, upstream=up, timeout_s=5)
    a, b = node.get_unit(0, 0, 0), node.get_unit(0, 0, 0)
    # both children have the first pieces while upstream still holds back the last
    assert [next(a), next(a), next(b)] == ["first", "second", "first"]
    up.gate.set()
    assert list(a) == ["last"] and list(b) == ["second", "last"]
    assert node.fetches_upstream == 1


def test_broadcast_error_reaches_every_child_and_a_stalled_upstream_times_out() -> None:
    class Failing(FakeUpstream):
        def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterator[Unit]:
            yield "first"
            raise ConnectionError("memoryx-0 went away")

    node = SwarmNodeLogic(num_children=2, upstream=Failing(), timeout_s=5)
    for child in (node.get_unit(1, 0, 0), node.get_unit(1, 0, 0)):
        assert next(child) == "first"
        with pytest.raises(ConnectionError, match="went away"):
            next(child)
    trickle = TrickleUpstream()
    stalled = SwarmNodeLogic(num_children=1, upstream=trickle, timeout_s=0.2)
    child = stalled.get_unit(2, 0, 0)
    assert [next(child), next(child)] == ["first", "second"]
    with pytest.raises(TimeoutError, match="nothing more received"):
        next(child)
    trickle.gate.set()  # let its puller thread finish


@pytest.mark.parametrize("children", [1, 2, 3, 7, 16])
def test_reduce_is_exact_and_independent_of_arrival_order(children: int, rng) -> None:
    grads: list[Mapping[str, np.ndarray]] = [
        {
            "a": rng.standard_normal(50).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3)),
            "b": rng.standard_normal((4, 4)).astype(np.float32),
        }
        for _ in range(children)
    ]
    expected = sum_in_order(grads)
    for order in (range(children), reversed(range(children)), rng.permutation(children)):
        up = FakeUpstream()
        node = SwarmNodeLogic(children, up, timeout_s=5)
        for c in order:
            node.push_grads(0, 2, int(c), grads[c])
        [(step, unit, out)] = up.pushed
        assert (step, unit) == (0, 2)
        for k in expected:
            assert_array_equal(out[k], expected[k])  # bitwise: child order, not arrival order
    exact = np.sum([g["a"].astype(np.float64) for g in grads], axis=0)
    np.testing.assert_allclose(expected["a"], exact, rtol=1e-5, atol=1e-4)


def test_reduce_rejects_duplicates_and_bad_children() -> None:
    node = SwarmNodeLogic(2, FakeUpstream(), timeout_s=5)
    node.push_grads(0, 0, 0, {"w": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="twice"):
        node.push_grads(0, 0, 0, {"w": np.zeros(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="out of range"):
        node.push_grads(0, 0, 2, {"w": np.zeros(1, dtype=np.float32)})

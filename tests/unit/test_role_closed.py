"""A role whose logic is closed mid-call (its process stopping, or a new configuration replacing it) says so
as RoleClosedError, which callers see as UNAVAILABLE: a fault a retry at the replacement may cure, not an
INTERNAL error that fails the job (a step failed that way "with every role alive" ends the run)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.swarmx_fakes import TrickleUpstream
from tests.worker_fakes import MODEL, STEP, WEIGHTS, WORKERS, FakeBatches, FakeUnits
from weightstream.memoryx.shard import ShardClosedError
from weightstream.swarmx.node import SwarmNodeLogic
from weightstream.training.recovery import is_transient
from weightstream.transport.errors import PeerError, RoleClosedError
from weightstream.transport.rpc import abort_on_error, call, create_server, stream
from weightstream.worker.engine import Tensors, WorkerEngine


def test_a_closed_swarmx_node_fails_its_waiting_children_and_new_calls_as_closed() -> None:
    up = TrickleUpstream()
    node = SwarmNodeLogic(num_children=2, upstream=up, timeout_s=5)
    waiting = node.get_unit(0, 0, 0)
    assert [next(waiting), next(waiting)] == ["first", "second"]  # upstream holds back the last piece
    node.close()
    with pytest.raises(RoleClosedError, match="SwarmX node was closed"):
        next(waiting)
    with pytest.raises(RoleClosedError):
        node.get_unit(0, 1, 0)
    with pytest.raises(RoleClosedError):
        node.push_grads(0, 0, 0, {})
    up.gate.set()  # let the puller thread finish


class _Stalling(FakeUnits):
    """Serves unit 0, then holds every other fetch until ``release``."""

    def __init__(self) -> None:
        super().__init__(WEIGHTS)
        self.release = threading.Event()
        self.held = threading.Event()

    def get_unit(self, step: int, unit: int, phase: int) -> Tensors:
        if unit != 0:
            self.held.set()
            self.release.wait(10)
        return super().get_unit(step, unit, phase)


def test_a_worker_closed_mid_step_gives_up_as_closed_and_so_does_a_step_asked_for_after() -> None:
    units = _Stalling()
    engine = WorkerEngine(MODEL, 0, WORKERS, units, FakeBatches())
    with ThreadPoolExecutor(1) as pool:
        step = pool.submit(engine.run_step, STEP)
        assert units.held.wait(10)
        engine.close()  # the pools shut down: the fetches not yet started are cancelled
        units.release.set()
        with pytest.raises(RoleClosedError, match="worker 0 was closed"):
            step.result(timeout=30)
    with pytest.raises(RoleClosedError):  # the pools refuse new fetches: still "closed", not INTERNAL
        engine.run_step(STEP + 1)
    with pytest.raises(RoleClosedError):
        engine.evaluate(STEP, 1)


def test_an_engine_still_open_reports_its_real_error() -> None:
    class Broken(FakeUnits):
        def get_unit(self, step: int, unit: int, phase: int) -> Tensors:
            raise ValueError("unit 0: no such tensor")

    engine = WorkerEngine(MODEL, 0, WORKERS, Broken(WEIGHTS), FakeBatches())
    try:
        with pytest.raises(ValueError, match="no such tensor"):
            engine.run_step(STEP)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "error",
    [
        ShardClosedError("this MemoryX shard was closed (its role is stopping or reconfigured)"),
        RoleClosedError("worker 0 was closed"),
    ],
    ids=["memoryx", "worker"],
)
def test_over_grpc_a_closed_role_is_unavailable_and_the_coordinator_retries(error: Exception) -> None:
    """A servicer maps what its logic raised with ``abort_on_error``; the caller's ``call`` names the
    status, and recovery's ``is_transient`` reads it."""

    def fails(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        abort_on_error(context, error)
        yield b""  # never reached

    handler = grpc.method_handlers_generic_handler(
        "test.Closed", {"Get": grpc.unary_stream_rpc_method_handler(fails, lambda b: b, lambda b: b)}
    )
    server, port = create_server("127.0.0.1:0", lambda s: s.add_generic_rpc_handlers((handler,)), workers=2)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            get = channel.unary_stream("/test.Closed/Get", lambda b: b, lambda b: b)
            with pytest.raises(PeerError) as err:
                list(stream("memoryx-0", "Get", call("memoryx-0", "Get", get, b"", timeout=10)))
    finally:
        server.stop(None)
    assert "UNAVAILABLE" in str(err.value) and "was closed" in str(err.value)
    assert is_transient(err.value)

"""bench/rpc_costs.py: both ways of asking for units move every unit through the authenticated role plane
(its server in a thread of this process). The script's JSON line is checked in
tests/integration/bench/test_rpc_costs.py."""

from __future__ import annotations

import threading
from types import ModuleType

import grpc
import pytest

from tests.bench_module import load_bench
from weightstream.transport.auth import new_role_token
from weightstream.transport.rpc import open_channel


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("rpc_costs")


class _Ready:
    def __init__(self) -> None:
        self.port: int | None = None
        self.event = threading.Event()

    def put(self, port: int) -> None:
        self.port = port
        self.event.set()


@pytest.fixture(scope="module")
def served(bench: ModuleType) -> tuple[str, str]:
    """(address, token) of the bench's server, in a thread of this process (it serves until exit)."""
    token, ready = new_role_token(), _Ready()
    threading.Thread(target=bench._serve, args=("127.0.0.1:0", token, 300, ready), daemon=True).start()
    assert ready.event.wait(30)
    return f"127.0.0.1:{ready.port}", token


@pytest.mark.parametrize("kind", ["call_per_unit", "stream_per_pass"])
def test_every_unit_is_one_message_received(bench: ModuleType, served: tuple[str, str], kind: str) -> None:
    address, token = served
    channel = open_channel(address, token)
    cpu_s, wall_s, received = bench.measure(channel, kind, 33, 11, timeout=30)
    assert received == 33 and cpu_s >= 0 and wall_s > 0
    channel.close()


def test_the_server_refuses_a_caller_without_the_job_credential(
    bench: ModuleType, served: tuple[str, str]
) -> None:
    """What the bench prices is the role plane with its credential check, not an open server."""
    address, _ = served
    channel = open_channel(address, new_role_token())  # another job's token
    with pytest.raises(grpc.RpcError) as err:
        bench.measure(channel, "call_per_unit", 1, 1, timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()

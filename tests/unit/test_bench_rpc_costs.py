"""bench/rpc_costs.py: both ways of asking for units move every unit through the authenticated role plane,
and its one JSON line carries per-unit costs whose ratios are their quotients."""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from tests.bench_module import load_bench, run_bench_json
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


def test_json_line_has_both_transports_and_ratios_are_quotients(tmp_path: Path) -> None:
    out: dict[str, Any] = run_bench_json(
        "rpc_costs", ["--units", "22", "--pass-units", "11", "--rounds", "1"], tmp_path, timeout=120
    )
    assert out["bench"] == "rpc_costs" and out["config"]["pass_units"] == 11
    # the record's header (bench/machine.py): where, when, how and on which code it ran
    assert out["command"] == "python bench/rpc_costs.py --units 22 --pass-units 11 --rounds 1"
    assert {"cpu", "cores", "ram_gib"} <= out["machine"].keys() and out["source"] == "run"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", out["date"]) and re.match(r"[0-9a-f]{40}", out["commit"])
    costs = out["cpu_us_per_unit"]
    for transport in ("tcp_loopback", "unix_socket"):
        for kind in ("call_per_unit", "stream_per_pass"):
            c = costs[transport][kind]
            assert c["client_cpu_us_per_unit"] >= 0 and c["server_cpu_us_per_unit"] >= 0
            assert c["wall_us_per_unit"] > 0

    def both(t: str, k: str) -> float:
        return float(costs[t][k]["client_cpu_us_per_unit"] + costs[t][k]["server_cpu_us_per_unit"])

    tcp = out["tcp_both_ends_cpu_us_per_unit"]
    assert tcp == {
        "call_per_unit": both("tcp_loopback", "call_per_unit"),
        "stream_per_pass": both("tcp_loopback", "stream_per_pass"),
    }
    assert math.isclose(
        out["ratio_stream_over_call"], tcp["stream_per_pass"] / tcp["call_per_unit"], abs_tol=1e-3
    )
    want = both("unix_socket", "call_per_unit") / tcp["call_per_unit"]
    assert math.isclose(out["ratio_unix_over_tcp_call"], want, abs_tol=1e-3)

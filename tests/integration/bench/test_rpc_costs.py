"""bench/rpc_costs.py run as a script: its one JSON line carries per-unit costs over both transports whose
ratios are their quotients. Its server and measurements are tested in tests/unit/bench/test_rpc_costs.py."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from tests.bench_module import run_bench_json


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

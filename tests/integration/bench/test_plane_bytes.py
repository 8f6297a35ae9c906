"""bench/plane_bytes.py: each of its four ways moves every byte of a round, and its JSON line's ratios
are the quotients of the figures it prints beside them."""

from __future__ import annotations

from pathlib import Path

from tests.bench_module import run_bench_json


def test_prices_a_byte_four_ways_in_one_line(tmp_path: Path) -> None:
    out = run_bench_json("plane_bytes", ["--chunks", "2", "--rounds", "1"], tmp_path, timeout=120)
    assert out["bench"] == "plane_bytes" and out["config"]["chunks"] == 2
    for way in ("plane", "inline", "grpc", "socket"):
        assert out[way]["cpu_ns_per_byte"] > 0 and out[way]["gb_per_s"] > 0, (way, out[way])
    plane = out["plane"]["cpu_ns_per_byte"]
    assert out["inline_over_plane_cpu"] == round(out["inline"]["cpu_ns_per_byte"] / plane, 3)
    assert out["grpc_over_plane_cpu"] == round(out["grpc"]["cpu_ns_per_byte"] / plane, 3)
    assert out["socket_over_plane_cpu"] == round(out["socket"]["cpu_ns_per_byte"] / plane, 3)

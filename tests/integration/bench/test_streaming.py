"""bench/streaming.py end to end in a tiny config, run as a script: its one JSON line, the figures the
performance targets read, and the overhead ratio as the median of pairs. Its arithmetic is tested in
tests/unit/bench/test_streaming.py."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from tests.bench_module import run_bench_json

TINY = ["--hidden", "64", "--layers", "2", "--seq", "32", "--batch", "4", "--vocab", "512", "--steps", "3"]


@pytest.mark.slow  # ~15 s (seven tiny jobs): in .ci/run's slow phase, keeping the default suite short
def test_streaming_bench_reports_pairs_and_their_median(tmp_path: Path) -> None:
    args = [*TINY, "--bw-hidden", "64", "--repeats", "1", "--pairs", "3"]
    out = run_bench_json("streaming", args, tmp_path, timeout=240)
    assert out["bench"] == "streaming" and out["config"]["pairs"] == 3
    pairs = out["streaming_overhead_pairs"]
    assert len(pairs) == 3 and all(math.isfinite(x) and x > 0 for x in pairs)
    assert out["streaming_overhead_ratio"] == round(statistics.median(pairs), 3)
    interval = out["streaming_overhead_interval"]  # three pairs: their extremes, covering 1 - 2/8
    assert (interval["low"], interval["high"]) == (min(pairs), max(pairs))
    assert interval["coverage"] == 0.75
    refs, ones = out["reference_runs_step_s"], out["appliance_runs_step_s"]
    assert len(refs) == 4 and len(ones) == 3  # reference, appliance, reference, ..., reference
    bracketed = [o / ((r0 + r1) / 2) for o, r0, r1 in zip(ones, refs[:-1], refs[1:], strict=True)]
    assert pairs == pytest.approx(bracketed, rel=0.03)  # from the runs as the JSON rounds them (0.1 ms)
    computes, waits = out["appliance_runs_worker_compute_s"], out["appliance_runs_worker_wait_s"]
    assert len(computes) == len(waits) == 3  # each appliance run's parts, from its metrics.jsonl
    assert all(0 < c <= o * 1.05 and w >= 0 for c, w, o in zip(computes, waits, ones, strict=True))
    ref, one = out["reference_step_s"], out["appliance_step_s_num_csx_1"]
    assert ref == pytest.approx(statistics.median(refs), abs=1e-4)  # medians of the runs (rounded)
    assert one == pytest.approx(statistics.median(ones), abs=1e-4)
    tokens = 4 * 32
    tps = out["tokens_per_second"]  # from the unrounded step times, which the JSON rounds to 0.1 ms
    assert math.isclose(tps["num_csx_1"], tokens / one, rel_tol=0.01)
    assert math.isclose(tps["reference"], tokens / ref, rel_tol=0.02)
    assert tps["num_csx_2"] > 0
    bw = out["bandwidth_gbps"]
    assert "raw_grpc_loopback" in bw and any("swarmx" in k for k in bw)
    assert all(v > 0 for v in bw.values())
    want = bw["memoryx_via_swarmx"] / bw["raw_grpc_loopback"]  # from the rounded figures
    assert math.isclose(out["bandwidth_ratio_swarmx_over_raw"], want, rel_tol=0.02, abs_tol=2e-3)

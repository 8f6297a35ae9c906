"""bench/streaming.py end to end in a tiny config: its one JSON line, the figures the performance targets
read, and the overhead ratio as the median of pairs, each appliance run against the reference runs either
side of it."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from tests.bench_module import load_bench, run_bench_json

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


def test_the_overhead_is_the_median_of_the_pairs_ratios() -> None:
    """Not the ratio of the medians (3.0 / 2.5 here): each appliance run is compared with the mean of the
    reference runs just before and just after it."""
    overhead = load_bench("streaming").overhead
    ratio, pairs = overhead([1.0, 2.0, 3.0, 4.0], [3.0, 2.2, 3.1])
    assert pairs == [3.0 / 1.5, 2.2 / 2.5, 3.1 / 3.5]
    assert ratio == 3.1 / 3.5


def test_a_steady_drift_of_the_machine_is_not_read_as_overhead() -> None:
    """The machine slows by 10% a run, the appliance costing exactly the reference: every pair reads 1.0
    (a reference measured only before each appliance run would read 1.05 every time)."""
    overhead = load_bench("streaming").overhead
    refs = [1.0, 1.1, 1.2, 1.3]
    ones = [1.05, 1.15, 1.25]  # each run halfway between the reference runs around it
    ratio, pairs = overhead(refs, ones)
    assert pairs == pytest.approx([1.0, 1.0, 1.0]) and ratio == pytest.approx(1.0)


def test_appliance_runs_must_be_bracketed_by_reference_runs() -> None:
    overhead = load_bench("streaming").overhead
    with pytest.raises(ValueError, match="3 appliance runs need 4 reference runs"):
        overhead([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])


def test_the_interval_for_the_median_comes_from_order_statistics() -> None:
    """Nine pairs: the 2nd smallest and 2nd largest bound the median with probability 1 - 2 * 10/512
    (the textbook table's 96.1%); the 3rd and 7th would cover only 82%, below 95%."""
    median_interval = load_bench("streaming").median_interval
    pairs = [1.09, 0.98, 1.03, 1.01, 1.20, 1.02, 1.04, 1.00, 1.05]
    low, high, coverage = median_interval(pairs)
    assert (low, high) == (1.00, 1.09)
    assert coverage == pytest.approx(1 - 20 / 512)
    assert median_interval(list(range(20)))[:2] == (5, 14)  # the table's 6th and 15th of 20


def test_too_few_pairs_get_the_extremes_and_say_their_coverage() -> None:
    """Five pairs cannot reach 95%: the extremes are returned with what they cover, 1 - 2/32."""
    median_interval = load_bench("streaming").median_interval
    assert median_interval([1.0, 1.3, 0.9, 1.1, 1.2]) == (0.9, 1.3, pytest.approx(0.9375))
    with pytest.raises(ValueError, match="at least 2 values"):
        median_interval([1.0])


def test_one_pair_reports_no_interval_instead_of_failing_the_run() -> None:
    interval_field = load_bench("streaming").interval_field
    assert interval_field([1.04]) is None
    assert interval_field([1.0, 1.1, 1.2]) == {"low": 1.0, "high": 1.2, "coverage": 0.75}


def test_every_appliance_measurement_is_a_run_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pairs' appliance figures come from as many runs: `weightstream run` in a directory it has used
    resumes from the finished checkpoint and trains nothing, so each run needs a directory of its own.
    (The command is replaced by one that behaves that way, writing each run's step times.)"""
    bench = load_bench("streaming")
    runs: list[Path] = []

    def fake_run(cmd: list[str], **_: object) -> None:
        model_dir = Path(cmd[cmd.index("--model_dir") + 1])
        if (model_dir / "metrics.jsonl").exists():
            return  # resumed at max_steps: nothing to train, as the real command does
        runs.append(model_dir)
        step = 0.1 * len(runs)
        rows = [
            json.dumps({"step": i, "step_time_s": step, "worker_compute_s": step, "worker_wait_s": 0.0})
            for i in range(1, 4)
        ]
        (model_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    raw = {"train_input": {"batch_size": 4, "max_sequence_length": 32}}
    firsts = [bench.appliance_step_s(raw, 1, tmp_path)[0] for _ in range(3)]
    assert firsts == pytest.approx([0.1, 0.2, 0.3]) and len(set(runs)) == 3

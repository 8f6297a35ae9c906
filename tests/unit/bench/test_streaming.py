"""bench/streaming.py's arithmetic: the overhead ratio as the median of pairs, each appliance run against
the reference runs either side of it, and its interval. A run end to end is in
tests/integration/bench/test_streaming.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_module import load_bench


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

"""bench/pool.py: the pairs of several streaming bench runs taken together, as one run of that many pairs
would give them, and runs that cannot be pooled refused by name."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench_module import load_bench

BENCH = Path(__file__).resolve().parents[3] / "bench"
CONFIG = {"hidden": 512, "layers": 4, "seq": 256, "batch": 8, "vocab": 8192, "steps": 10, "pairs": 3}
EPYC = {"cpu": "AMD EPYC", "cores": 2, "ram_gib": 23.5}


def _run(ratios: list[float], **config: Any) -> dict[str, Any]:
    return {
        "bench": "streaming",
        "config": {**CONFIG, **config},
        "streaming_overhead_ratio": round(statistics.median(ratios), 3),
        "streaming_overhead_pairs": ratios,
    }


def _pool(tmp_path: Path, *files: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    paths = []
    for i, runs in enumerate(files):
        path = tmp_path / f"runs{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in runs) + "\n")  # a blank line is skipped
        paths.append(str(path))
    cmd = [sys.executable, str(BENCH / "pool.py"), *paths]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_pairs_of_several_runs_pool_as_one_run_of_them_all(tmp_path: Path) -> None:
    a, b, c = [1.01, 1.06, 0.99], [1.04, 1.02, 1.08], [1.03, 1.05, 1.00]
    # two files; how many steps or repeats a run took may differ
    dated = [
        {**_run(x), "date": d, "machine": {**EPYC, "python": "3.11.7"}}
        for x, d in ((a, "2026-11-26"), (b, "2026-11-27"))
    ]
    proc = _pool(tmp_path, dated, [{**_run(c, steps=6, pairs=3, repeats=1), "machine": EPYC}])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # a record of its own (bench/results/README.md): the runs' machine, the newest run's date, the command
    assert out["source"] == "pooled" and out["machine"] == EPYC and out["date"] == "2026-11-27"
    assert out["command"] == f"python bench/pool.py {tmp_path / 'runs0.jsonl'} {tmp_path / 'runs1.jsonl'}"
    pooled = sorted(a + b + c)  # 9 pairs: the 2nd smallest and 2nd largest bound the median (1 - 2*10/512)
    assert out["runs"] == 3 and out["pairs"] == 9
    assert out["run_ratios"] == [1.01, 1.04, 1.03]
    assert out["streaming_overhead_ratio"] == statistics.median(pooled) == 1.03
    assert out["streaming_overhead_interval"] == {"low": pooled[1], "high": pooled[7], "coverage": 0.961}
    median_interval = load_bench("streaming").median_interval  # the bench's own, over the pooled pairs
    assert median_interval(pooled)[:2] == (pooled[1], pooled[7])


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_run([1.0, 1.1]), _run([1.0, 1.1], hidden=768)], "runs of different configs"),
        (
            [{**_run([1.0]), "machine": EPYC}, {**_run([1.0]), "machine": {**EPYC, "cpu": "Intel Xeon"}}],
            "runs of different machines",
        ),
        ([{"bench": "kernels"}], "not a line of bench/streaming.py"),
        ([{**_run([1.0]), "streaming_overhead_pairs": []}], "has no streaming_overhead_pairs"),
    ],
)
def test_runs_that_cannot_be_pooled_are_refused_by_name(
    tmp_path: Path, lines: list[dict[str, Any]], message: str
) -> None:
    proc = _pool(tmp_path, lines)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_a_line_that_is_not_json_is_named_with_its_file_and_number(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(_run([1.0, 1.02])) + "\n{truncated\n")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "pool.py"), str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and f"{path}:2: not a JSON line" in proc.stderr, proc.stderr

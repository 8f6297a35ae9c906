"""The streaming overhead of several `bench/streaming.py` runs taken together.

One run's 9 pairs bound the overhead's median to within ~+-5% on a shared 2-core machine: too wide to say
whether a ~4% overhead meets a 5% target. Runs of the same config pool: every pair is an independent
draw of the same ratio (an appliance run against the reference runs either side of it), so the pairs of
all the runs give the median and its order-statistics interval as one run of that many pairs would.
Runs of another config or another machine, or lines without pairs, are refused by name rather than mixed
in.

    python bench/streaming.py >> runs.jsonl     # as often as wanted, on the same code and machine
    python bench/pool.py runs.jsonl [more.jsonl ...]

Prints one JSON line, a record as bench/results/README.md describes (``"source": "pooled"``, the runs'
machine, the newest run's date): the runs and pairs pooled, each run's median, and the pooled median with
its interval and coverage.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path
from typing import Any

from machine import MACHINE_KEYS  # bench/machine.py: the fields that name a machine
from streaming import interval_field  # bench/streaming.py: the bench's own interval, as its JSON gives it

# the config keys that change what a pair measures (not how many pairs or steps a run took)
MODEL_KEYS = ("hidden", "layers", "seq", "batch", "vocab")


def read_runs(paths: list[Path]) -> list[dict[str, Any]]:
    """Every streaming bench line in ``paths`` (JSON lines; other lines are refused, naming file and line)."""
    runs = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                run = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{where}: not a JSON line ({e})") from e
            if not isinstance(run, dict) or run.get("bench") != "streaming":
                raise SystemExit(f"{where}: not a line of bench/streaming.py")
            if not run.get("streaming_overhead_pairs"):
                # pairs come from runs that bracket each appliance run by reference runs
                raise SystemExit(f"{where}: has no streaming_overhead_pairs to pool")
            runs.append(run)
    if not runs:
        raise SystemExit("no bench/streaming.py runs in " + ", ".join(map(str, paths)))
    return runs


def pool(runs: list[dict[str, Any]], command: str = "python bench/pool.py") -> dict[str, Any]:
    """The pooled figure of ``runs``, which must share their model config and machine (a pair is a draw of
    one machine's ratio), as a record of ``command``."""
    configs = {tuple(r["config"].get(k) for k in MODEL_KEYS) for r in runs}
    if len(configs) > 1:
        raise SystemExit(f"runs of different configs ({', '.join(MODEL_KEYS)}): {sorted(configs)}")
    machines = {tuple((r.get("machine") or {}).get(k) for k in MACHINE_KEYS) for r in runs}
    if len(machines) > 1:
        raise SystemExit(
            f"runs of different machines ({', '.join(MACHINE_KEYS)}): {sorted(machines, key=str)}"
        )
    pairs = [float(x) for r in runs for x in r["streaming_overhead_pairs"]]
    commits = {r.get("commit") for r in runs}
    out: dict[str, Any] = {
        "bench": "streaming_pooled",
        "date": max((r["date"] for r in runs if r.get("date")), default=None),
        "command": command,
        "commit": commits.pop() if len(commits) == 1 else None,  # runs of several commits: none of them
        "machine": dict(zip(MACHINE_KEYS, machines.pop(), strict=True)),
        "source": "pooled",
        "config": {k: runs[0]["config"].get(k) for k in MODEL_KEYS},
        "runs": len(runs),
        "pairs": len(pairs),
        "run_ratios": [r["streaming_overhead_ratio"] for r in runs],
        "streaming_overhead_ratio": round(statistics.median(pairs), 4),
        "streaming_overhead_interval": interval_field(pairs),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="JSON lines printed by bench/streaming.py")
    a = ap.parse_args()
    command = shlex.join(["python", "bench/pool.py", *map(str, a.files)])
    print(json.dumps(pool(read_runs(a.files), command)))


if __name__ == "__main__":
    main()

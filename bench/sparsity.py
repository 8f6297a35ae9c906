"""Unstructured weight sparsity: wire bytes, worker compute and step time against dense, in one run.

For each sparsity level (0 is the dense baseline: no ``sparsity`` block at all) a GPT-2 of the d768
class (hidden 768, 12 heads, filter 3072; ``--layers`` blocks, a small vocabulary so that the dense
embedding does not hide what the blocks save) trains ``--steps`` steps through `weightstream run` on one
CS-2 worker (so the worker's compute time is its own, not shared with a second worker on these cores),
over gRPC (``data_plane: grpc``: bytes travel as they would between hosts). From ``metrics.jsonl`` it takes
the medians, over the steps after the first (which compiles the kernels and warms the caches), of:

- ``worker_wire_bytes``: weights in and gradients out on the worker's link, per step;
- ``worker_compute_s``: the worker's compute, per step;
- ``step_time_s``: the whole step, as the coordinator sees it;

and the training loss at the last step. Every level trains the same data from the same seed.

Prints one JSON line:
``{"by_sparsity": {"0.9": {"wire_bytes_ratio": x, "worker_time_ratio": y, "step_time_ratio": z, "loss": l},
...}, ...}`` with the ratios against sparsity 0 of the same run, and the absolute numbers beside them.

    python bench/sparsity.py [--layers 6 --vocab 2048 --seq 128 --batch 8 --steps 40]
                             [--levels 0,0.5,0.75,0.9,0.95]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from machine import record  # bench/machine.py: the machine, date, command and commit


def params_dict(a: argparse.Namespace, sparsity: float) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": a.batch,
            "max_sequence_length": a.seq,
            "shuffle_seed": 1,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": 768,
            "num_hidden_layers": a.layers,
            "num_heads": 12,
            "filter_size": 3072,
            "max_position_embeddings": a.seq,
        },
        # a warm-up: at a constant 1e-3 from step 0 the d768 model sits at the unigram plateau for longer
        # than the bench runs, and the loss would compare nothing
        "optimizer": {
            "optimizer_type": "adamw",
            "learning_rate": [
                {
                    "scheduler": "Linear",
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 1e-3,
                    "total_iters": 10,
                },
                {"scheduler": "Constant", "learning_rate": 1e-3},
            ],
            "max_gradient_norm": 1.0,
        },
        "runconfig": {
            "max_steps": a.steps,
            "log_steps": 1,
            "seed": 1,
            "num_wgt_servers": 1,
            "data_plane": "grpc",
            "num_csx": 1,
        },
    }
    if sparsity > 0:
        raw["sparsity"] = {"sparsity": sparsity, "init_method": "random"}
    return raw


def measure(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the steps after the first, and the last step's loss, from metrics.jsonl rows."""
    steps = sorted((r for r in rows if "loss" in r), key=lambda r: r["step"])
    if len(steps) < 2:
        raise SystemExit(f"need at least 2 logged steps, got {len(steps)}")
    warm = steps[1:]
    return {
        "wire_bytes": statistics.median(r["worker_wire_bytes"] for r in warm),
        "worker_s": statistics.median(r["worker_compute_s"] for r in warm),
        "step_s": statistics.median(r["step_time_s"] for r in warm),
        "loss": steps[-1]["loss"],
    }


def ratios(results: dict[float, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each level against level 0 (dense) of the same run."""
    dense = results[0.0]
    out = {}
    for level, r in sorted(results.items()):
        out[str(level)] = {
            "wire_bytes_ratio": round(r["wire_bytes"] / dense["wire_bytes"], 4),
            "worker_time_ratio": round(r["worker_s"] / dense["worker_s"], 3),
            "step_time_ratio": round(r["step_s"] / dense["step_s"], 3),
            "loss": round(r["loss"], 4),
            "wire_bytes": int(r["wire_bytes"]),
            "worker_compute_s": round(r["worker_s"], 4),
            "step_time_s": round(r["step_s"], 4),
        }
    return out


def run_level(a: argparse.Namespace, base: Path, level: float) -> dict[str, float]:
    d = base / f"sparsity_{level}"
    d.mkdir()
    params = d / "params.yaml"
    params.write_text(yaml.safe_dump(params_dict(a, level)))
    cmd = [sys.executable, "-m", "weightstream.cli", "run", str(params), "--model_dir", str(d / "m")]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"sparsity {level}: weightstream run failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in (d / "m" / "metrics.jsonl").read_text().splitlines()]
    out = measure(rows)
    print(f"sparsity {level}: {out} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--levels", default="0,0.5,0.75,0.9,0.95")
    a = ap.parse_args()
    levels = sorted({float(x) for x in a.levels.split(",")} | {0.0})
    with tempfile.TemporaryDirectory(prefix="bench_sparsity_") as tmp:
        results = {level: run_level(a, Path(tmp), level) for level in levels}
    doc = {
        "bench": "sparsity",
        "model": f"gpt2 d768 x{a.layers} layers, vocab {a.vocab}",
        "tokens_per_step": a.batch * a.seq,
        "steps": a.steps,
        "by_sparsity": ratios(results),
    }
    print(json.dumps(record("sparsity", doc)))


if __name__ == "__main__":
    main()

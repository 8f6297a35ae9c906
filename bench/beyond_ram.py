"""Train a GPT-2 whose fp32 weights and Adam state do not fit in RAM, through `weightstream run`.

The default model (d4096, 12 layers, 32 heads, vocab 8192: about 2.45 billion parameters, ~27 GiB of
weights plus Adam state) trains 3 steps at batch 2, sequence 64, a constant learning rate and no gradient
clipping, on text (byte tokens of the text files found on this machine), with ``memoryx_storage: disk`` and
``checkpoint_optimizer_state: false``. While it runs, every process of the appliance is sampled (psutil,
/proc) for its resident memory, anonymous plus shared (RssAnon + RssShmem: the page cache that disk mode
leans on is the kernel's, reclaimable, and not counted), and the run's directory for its disk use.

Prints one JSON line: parameters, state bytes, RAM bytes, per-step times (compute, streaming wait, update,
MemoryX I/O), the losses, peak resident memory per role and of the whole appliance, disk bytes read and
written, and peak disk use.

    python bench/beyond_ram.py [--hidden 4096 --layers 12 --heads 32 --vocab 8192 --steps 3]
                               [--dir DIR (default: a new directory under the current one)] [--keep]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from machine import record  # bench/machine.py: the machine, date, command and commit
from text_corpus import text_corpus  # bench/text_corpus.py

from weightstream.params import load_params
from weightstream.params.size import num_params

_ROLE = re.compile(r"(memoryx|swarmx|worker|activation)-\d+")


def params_dict(a: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    return {
        "train_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(data_dir),
            "batch_size": a.batch,
            "max_sequence_length": a.seq,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": a.hidden,
            "num_hidden_layers": a.layers,
            "num_heads": a.heads,
            "max_position_embeddings": a.seq,
        },
        "optimizer": {"optimizer_type": "adamw", "learning_rate": a.lr},  # constant, no clipping
        "runconfig": {
            "max_steps": a.steps,
            "log_steps": 1,
            "num_wgt_servers": a.shards,
            "seed": 1,
            "memoryx_storage": "disk",
            "checkpoint_optimizer_state": False,
            "recovery_snapshot_steps": 0,
            "rpc_timeout_s": 3600.0,
        },
    }


class Sampler(threading.Thread):
    """Every ``period`` s: each appliance process's RssAnon + RssShmem (peak per role and of all together,
    summed at the same instant), its disk I/O counters, and the run directory's disk use."""

    def __init__(self, root: psutil.Process, run_dir: Path, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.root, self.run_dir, self.period = root, run_dir, period
        self.peak_role: dict[str, int] = {}
        self.peak_total = 0
        self.io: dict[int, tuple[str, int, int]] = {}  # pid -> (role, read_bytes, write_bytes), last seen
        self.peak_disk = 0
        self._halt = threading.Event()

    @staticmethod
    def _role(p: psutil.Process, root: psutil.Process) -> str:
        if p.pid == root.pid:
            return "coordinator"
        m = _ROLE.search(" ".join(p.cmdline()))
        return m.group(0) if m else "other"

    @staticmethod
    def _resident(pid: int) -> int:
        fields = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssShmem"):
                    fields[key] = int(value.split()[0]) * 1024
        return sum(fields.values())

    def run(self) -> None:
        last_disk = 0.0
        while not self._halt.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    role = self._role(p, self.root)
                    rss = self._resident(p.pid)
                    io = p.io_counters()
                except (psutil.Error, OSError):
                    continue
                total += rss
                self.peak_role[role] = max(self.peak_role.get(role, 0), rss)
                self.io[p.pid] = (role, io.read_bytes, io.write_bytes)
            self.peak_total = max(self.peak_total, total)
            if time.monotonic() - last_disk > 2.0:
                self.peak_disk = max(self.peak_disk, disk_use(self.run_dir))
                last_disk = time.monotonic()
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def disk_use(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (allocated blocks: a sparse file counts its data)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def memoryx_io(log_dir: Path) -> dict[int, float]:
    """Seconds each step's MemoryX spent in disk I/O, from the shards' logs (totals per step, summed over
    the shards; each log line carries the shard's running total)."""
    per_step: dict[int, float] = {}
    pattern = re.compile(r"step (\d+) applied: .* ([\d.]+) s in I/O")
    for log in sorted(log_dir.glob("memoryx-*.log")):
        last = 0.0
        for m in pattern.finditer(log.read_text(errors="replace")):
            step, total = int(m.group(1)), float(m.group(2))
            per_step[step] = per_step.get(step, 0.0) + total - last
            last = total
    return per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--shards", type=int, default=2, help="MemoryX shards (num_wgt_servers)")
    ap.add_argument("--dir", type=Path, default=None, help="where the run's files go (must hold ~40 GB)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    a = ap.parse_args()

    base = a.dir or Path(tempfile.mkdtemp(prefix="beyond_ram_", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    data_dir, model_dir = base / "text", base / "model_dir"
    text_corpus(data_dir, 200_000, required=4096)
    raw = params_dict(a, data_dir)
    params_path = base / "params.yaml"
    params_path.write_text(yaml.safe_dump(raw))
    n = num_params(load_params(raw).model)
    state_bytes = 3 * 4 * n  # fp32 weights, Adam's exp_avg and exp_avg_sq
    ram = psutil.virtual_memory().total
    print(
        f"{n / 1e9:.2f}B parameters, {state_bytes / 2**30:.1f} GiB of weights + Adam state, "
        f"{ram / 2**30:.1f} GiB of RAM; running in {base}",
        file=sys.stderr,
    )
    cmd = [sys.executable, "-m", "weightstream.cli", "run", str(params_path), "--model_dir", str(model_dir)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(psutil.Process(proc.pid), base)
    sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", file=sys.stderr)
    rc = proc.wait()
    sampler.stop()
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"weightstream run failed ({rc}); files kept in {base}")
    rows = [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    io_s = memoryx_io(model_dir / "logs")
    losses = [r["loss"] for r in steps]
    io_by_role: dict[str, list[int]] = {}
    for role, rb, wb in sampler.io.values():
        kind = role.split("-")[0]
        got = io_by_role.setdefault(kind, [0, 0])
        got[0] += rb
        got[1] += wb
    result = {
        "bench": "beyond_ram",
        "parameters": n,
        "state_bytes": state_bytes,
        "ram_bytes": ram,
        "state_over_ram": round(state_bytes / ram, 3),
        "model": {
            k: raw["model"][k] for k in ("hidden_size", "num_hidden_layers", "num_heads", "vocab_size")
        },
        "batch": a.batch,
        "seq": a.seq,
        "memoryx_shards": a.shards,
        "losses": losses,
        "loss_falls": all(b < x for x, b in itertools.pairwise(losses)),
        "step_s": [round(r["step_time_s"], 1) for r in steps],
        "split_s_median": {
            "compute": round(statistics.median(r["worker_compute_s"] for r in steps), 1),
            "streaming_wait": round(statistics.median(r["worker_wait_s"] for r in steps), 1),
            "update": round(statistics.median(r["update_s"] for r in steps), 1),
            "memoryx_io": round(statistics.median(io_s.values()), 1) if io_s else None,
        },
        "peak_resident_bytes": dict(sorted(sampler.peak_role.items())),
        "peak_resident_appliance_bytes": sampler.peak_total,
        "peak_resident_appliance_over_ram": round(sampler.peak_total / ram, 3),
        "disk_read_bytes": {k: v[0] for k, v in sorted(io_by_role.items())},
        "disk_written_bytes": {k: v[1] for k, v in sorted(io_by_role.items())},
        "peak_disk_use_bytes": sampler.peak_disk,
        "checkpoint_bytes": disk_use(model_dir / f"checkpoint_{a.steps}"),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(record("beyond_ram", result)))
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

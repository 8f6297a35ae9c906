"""What MemoryX replicas cost a job that has no fault, against recovery snapshots and against neither.

The same GPT-2 job as ``bench/chaos.py`` (local backend, JobRunner in this process) runs fault-free three
ways, in turn, in one process:
  none       ``memoryx_replicas: 0``, ``recovery_snapshot_steps: 0`` (checkpoints only): the baseline
  snapshots  ``memoryx_replicas: 0``, ``recovery_snapshot_steps: 10`` (the default without replicas)
  replicas   ``memoryx_replicas: 1``, ``recovery_snapshot_steps: 0``
and prints one JSON line: each way's median and mean step time, wall time and the peak resident memory of
its MemoryX processes (shards and replicas, sampled every 0.2 s), with ratios against the baseline. Every
run must end bitwise equal to the baseline's final checkpoint (``bitwise_equal``): neither a replica nor
a snapshot may change a number.

    python bench/replicas.py [--steps 60] [--smoke]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from chaos import checkpoints_equal, params_dict
from chaos import parse_args as chaos_args
from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.backends.local import LocalProcessBackend
from weightstream.params import load_params
from weightstream.plan import process_kind
from weightstream.training.events import JobEvent, StepEvent
from weightstream.training.runner import JobRunner, job_log

WAYS = {"none": (0, 0), "snapshots": (0, 10), "replicas": (1, 0)}  # (memoryx_replicas, snapshot steps)


class MemorySampler:
    """The peak of the summed resident memory of a backend's MemoryX processes, sampled on a thread."""

    def __init__(self, backend: LocalProcessBackend, every_s: float = 0.2) -> None:
        self.backend, self.every_s = backend, every_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memoryx-rss", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            total = 0
            for role, proc in list(self.backend.procs.items()):
                if process_kind(role.kind) != "memoryx":
                    continue
                with contextlib.suppress(psutil.Error):  # gone between the listing and the read
                    total += psutil.Process(proc.pid).memory_info().rss
            self.peak_bytes = max(self.peak_bytes, total)


def run_way(raw: dict[str, Any], model_dir: Path, replicas: int, snapshots: int) -> dict[str, Any]:
    raw = json.loads(json.dumps(raw))
    raw["runconfig"].update(
        model_dir=str(model_dir), memoryx_replicas=replicas, recovery_snapshot_steps=snapshots
    )
    params = load_params(raw)
    backend = LocalProcessBackend(model_dir / "logs")
    steps: list[float] = []

    def on_event(e: JobEvent) -> None:
        if isinstance(e, StepEvent):
            steps.append(e.record.step_time_s)

    t0 = time.monotonic()
    with MemorySampler(backend) as memory, job_log(model_dir, model_dir.name):
        summary = JobRunner(params, backend, on_event, job_id=model_dir.name).run()
    wall = time.monotonic() - t0
    warm = steps[1:] or steps  # the first warms caches up
    assert summary.checkpoint is not None
    return {
        "step_s_median": round(statistics.median(warm), 4),
        "step_s_mean": round(statistics.fmean(warm), 4),
        "wall_s": round(wall, 2),
        "memoryx_rss_peak_mib": round(memory.peak_bytes / 2**20, 1),
        "checkpoint": summary.checkpoint,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--smoke", action="store_true", help="chaos.py's tiny model, 20 steps: seconds")
    a = ap.parse_args(argv)
    job = chaos_args(["--smoke"] if a.smoke else [])
    job.steps = 20 if a.smoke else a.steps
    job.checkpoint_steps = job.steps  # one checkpoint, at the end, the same in every way
    raw = params_dict(job)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="replicas-") as tmp:
        for name, (replicas, snapshots) in WAYS.items():
            print(f"[replicas] {name}: {job.steps} steps", flush=True, file=sys.stderr)
            out[name] = run_way(raw, Path(tmp) / name, replicas, snapshots)
        base = out["none"]
        for way in out.values():
            way["bitwise_equal"] = checkpoints_equal(base["checkpoint"], way["checkpoint"])
        for way in out.values():
            del way["checkpoint"]
    ratios = {
        name: {
            "step_s_median": round(way["step_s_median"] / base["step_s_median"], 3),
            "step_s_mean": round(way["step_s_mean"] / base["step_s_mean"], 3),
            "memoryx_rss_peak": round(way["memoryx_rss_peak_mib"] / base["memoryx_rss_peak_mib"], 3),
        }
        for name, way in out.items()
        if name != "none"
    }
    shape = ("hidden", "layers", "seq", "batch", "vocab", "steps", "workers", "shards")
    config = {k: getattr(job, k) for k in shape}
    line = record("replicas", {"config": config, "ways": out, "ratio_to_none": ratios})
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    main()

"""The scaling model, calibrated here: run the real appliance at N = 1, 2, 4, calibrate the cost model from
N = 1 alone, predict N = 1 ... 192, and price a Cerebras-like cluster.

1. In-process timings, each in a fresh process with the thread settings the local backend gives that
   role: a worker's forward and backward per unit and sample on 1 .. all cores, MemoryX's update rate,
   SwarmX's gradient-adding rate.
2. The appliance at N = 1 (every role a local process, the coordinator in this process), four times: on
   the job's units with (almost) no compute (sequence 1, one sample): the transport's CPU per step (from
   /proc) and its step time, in shared memory; the same with every byte over gRPC on loopback
   (``runconfig.data_plane: grpc``): the network data plane's, which roles on separate hosts use; the
   first again on a tiny model: the latency of a transfer; and the job (GPT-2 hidden 512, 4 layers,
   vocab 8192, sequence 256, 8 samples per worker: about 2 s a step here).
3. ``weightstream.simulate.calibrate`` turns those into a ``Cluster`` for this machine (``--calibration-out``
   writes it for ``weightstream simulate --calibration``, and ``--data-plane network`` for roles on
   separate hosts) and predicts every N from it alone (every role here, shared memory).
4. The job at N = 2 and 4, each worker keeping its 8 samples (weak scaling, the model's default): measured
   only to compare with the predictions, never used by them.
5. The Cerebras-like preset (its assumed figures are printed) on a GPT-3 XL-sized GPT-2 (hidden 2048, 24
   layers, vocab 50257, sequence 2048, bfloat16 on the wire, 32 samples per worker), as SwarmX relays now
   (cut through: each message passed on as it arrives) and taking whole units first (store and forward).

Prints one JSON line: {"measured": {"1": s, "2": s, "4": s}, "predicted": {"1": s, ..., "192": s},
"error": {"1": ..}, "efficiency_16": x, "cluster": {...}, "cerebras_like": {...}, ...}. Step times are
medians over the steps after the first ``--skip``, counting only the steps during which processes outside
the job took at most ``--max-foreign`` of the machine (it is shared; every step's share is in the JSON) when
at least 5 were that quiet; a run with fewer, or a timing taken while others were busy, is done again (up
to ``--retries`` times while ``--budget`` lasts). About 7 minutes on the 2-core machine, 20 at most.

    python bench/scaling.py [--per-worker-batch 8 --steps 16 --skip 3 --calibration-out calibration.json]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.backends.environment import role_env
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import Params, load_params
from weightstream.simulate.calibrate import Measurements, NullRun, calibrate, median_steps, read_metrics
from weightstream.simulate.cluster import cerebras_like
from weightstream.simulate.model import Prediction, predict
from weightstream.simulate.report import breaks_at, overhead
from weightstream.simulate.workload import Workload, build_workload
from weightstream.training.events import JobEvent, StepEvent
from weightstream.training.runner import JobRunner, job_log

NS = [1, 2, 4, 8, 16, 32, 64, 128, 192]
MEASURED_NS = [1, 2, 4]
CLOCK = os.sysconf("SC_CLK_TCK")


def _time_for(seconds: float, a: argparse.Namespace) -> bool:
    """Whether ``seconds`` from now is still before the retry deadline (``--budget`` after the start); the
    runs still to come are left the rest of the 25 minutes."""
    return time.monotonic() + seconds < a.deadline


def progress(line: str) -> None:
    print(f"[scaling] {line}", file=sys.stderr, flush=True)


def params_dict(a: argparse.Namespace, n: int, seq: int, per_worker: int, steps: int) -> dict[str, Any]:
    return {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": per_worker * n,  # weak scaling: every worker keeps its samples
            "max_sequence_length": seq,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": a.hidden,
            "num_hidden_layers": a.layers,
            "num_heads": a.hidden // 64,
            "max_position_embeddings": a.seq,  # the same units whatever ``seq`` this run uses
        },
        "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-4, "max_gradient_norm": 1.0},
        "runconfig": {
            "num_csx": n,
            "max_steps": steps,
            "log_steps": 1,
            "num_wgt_servers": 1,
            "seed": 1,
            "recovery_snapshot_steps": 0,  # a snapshot would land inside the timed steps
            "checkpoint_steps": 0,
        },
    }


# -- in-process timings, each in a process with a role's thread settings -----------------------------------
_TIMING = """
import json, sys
from weightstream.params import Params, load_params
from weightstream.simulate.measure import time_reduce, time_units, time_update
p = load_params(json.loads(sys.argv[1]))
what, samples = sys.argv[2], int(sys.argv[3])
if what == "units":
    print(json.dumps(time_units(p, samples, repeats=7)))
else:
    print(json.dumps(time_update(p) if what == "update" else time_reduce()))
"""


def timed_in_role_process(
    raw: dict[str, Any], what: str, kind: str, cores: int, samples: int, a: argparse.Namespace
) -> Any:
    """Run one timing in a fresh process with the environment of a ``kind`` role given ``cores``; again
    (up to ``--retries`` times) while other processes took more than ``--max-foreign`` of the machine."""
    env = {**os.environ, **role_env(kind, cores)}
    cmd = [sys.executable, "-c", _TIMING, json.dumps(raw), what, str(samples)]
    for attempt in range(a.retries + 1):
        t0, b0, c0 = time.monotonic(), _busy_s(), os.times()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=True)
        t1, b1, c1 = time.monotonic(), _busy_s(), os.times()
        mine = sum(c1[:4]) - sum(c0[:4])  # this process and the finished child: user and system
        foreign = max(0.0, (b1 - b0 - mine) / ((t1 - t0) * (os.cpu_count() or 1)))
        progress(f"timed {what} ({kind}, {cores} cores): foreign CPU {foreign:.0%}")
        if foreign <= a.max_foreign or attempt == a.retries or not _time_for(3 * (t1 - t0), a):
            return json.loads(r.stdout)
        time.sleep(20)
    raise AssertionError("unreachable")


# -- the appliance -------------------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) process ``pid`` has used, all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK  # utime, stime (fields 14 and 15 of stat)


def _busy_s() -> float:
    """CPU-seconds the whole machine has been busy (every core; idle and iowait excluded)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / CLOCK


@dataclass
class Run:
    """One run of the appliance: its step records, and at each step's end the machine's busy CPU and each
    role kind's CPU, so that every step can be judged by how much CPU others took during it."""

    n: int
    max_foreign: float
    wall_s: float = 0.0
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> its metrics.jsonl record
    samples: dict[int, tuple[float, float, dict[str, float]]] = field(default_factory=dict)  # (t, busy, cpu)

    def foreign(self, step: int) -> float:
        """The share of the machine's cores that processes outside this job used during ``step``."""
        (t0, b0, c0), (t1, b1, c1) = self.samples[step - 1], self.samples[step]
        mine = sum(c1.values()) - sum(c0.values())
        return max(0.0, (b1 - b0 - mine) / ((t1 - t0) * (os.cpu_count() or 1)))

    def timed(self) -> list[int]:
        """The steps with a sample before and after (after the warm-up, before the last)."""
        return sorted(s for s in self.samples if s - 1 in self.samples and s in self.rows)

    def quiet(self) -> list[int]:
        """The timed steps during which others took at most ``max_foreign`` of the machine."""
        return [s for s in self.timed() if self.foreign(s) <= self.max_foreign]

    def used(self) -> list[int]:
        """The steps that count: the quiet ones if there are at least 5, else every timed step."""
        quiet = self.quiet()
        return quiet if len(quiet) >= 5 else self.timed()

    def step_rows(self) -> list[dict[str, Any]]:
        return [self.rows[s] for s in self.used()]

    def step_s(self) -> float:
        return statistics.median(self.rows[s]["step_time_s"] for s in self.used())

    def cpu_per_step(self) -> dict[str, float]:
        """CPU-seconds per step by role kind (the coordinator is this process) over the steps used."""
        out: dict[str, float] = {}
        for s in self.used():
            before, after = self.samples[s - 1][2], self.samples[s][2]
            for kind, cpu in after.items():
                out[kind] = out.get(kind, 0.0) + (cpu - before.get(kind, 0.0)) / len(self.used())
        return out

    def summary(self) -> dict[str, Any]:
        used = self.used()
        return {
            "step_s": round(self.step_s(), 4),
            "worker_wait_s": round(statistics.median(self.rows[s]["worker_wait_s"] for s in used), 4),
            "steps": {s: round(self.rows[s]["step_time_s"], 3) for s in self.timed()},
            "foreign_cpu_share": {s: round(self.foreign(s), 2) for s in self.timed()},
            "quiet_steps_used": len(used) if used == self.quiet() else 0,
            "cpu_s_per_step": {k: round(v, 3) for k, v in self.cpu_per_step().items()},
        }


def run_appliance(raw: dict[str, Any], workdir: Path, a: argparse.Namespace) -> Run:
    """Train ``raw`` with every role a local process; CPU samples at the end of each step after the
    first ``--skip`` (the first of them only starts the clock)."""
    n = raw["runconfig"]["num_csx"]
    model_dir = workdir / f"n{n}-seq{raw['train_input']['max_sequence_length']}-{time.monotonic_ns()}"
    params = load_params({**raw, "runconfig": {**raw["runconfig"], "model_dir": str(model_dir)}})
    backend = LocalProcessBackend(model_dir / "logs")
    run = Run(n, a.max_foreign)

    def on_event(e: JobEvent) -> None:
        # the roles stop after the last step
        if isinstance(e, StepEvent) and a.skip <= e.record.step < e.max_steps:
            cpu: dict[str, float] = {"coordinator": _cpu_s(os.getpid())}
            for role, proc in list(backend.procs.items()):
                cpu[role.kind] = cpu.get(role.kind, 0.0) + _cpu_s(proc.pid)
            run.samples[e.record.step] = (time.monotonic(), _busy_s(), cpu)

    t0 = time.monotonic()
    with job_log(model_dir, "scaling"):
        JobRunner(params, backend, on_event, job_id="scaling").run()
    run.wall_s = time.monotonic() - t0
    run.rows = {r["step"]: r for r in read_metrics(model_dir / "metrics.jsonl") if "step_time_s" in r}
    return run


def measured_run(raw: dict[str, Any], workdir: Path, a: argparse.Namespace) -> Run:
    """``run_appliance``; again (up to ``--retries`` times, while the budget allows) when fewer than 5
    of its steps ran with other processes taking at most ``--max-foreign`` of the machine."""
    for attempt in range(a.retries + 1):
        run = run_appliance(raw, workdir, a)
        quiet = len(run.quiet())
        progress(
            f"N={run.n} seq={raw['train_input']['max_sequence_length']}: step {run.step_s():.3f}s over "
            f"{len(run.used())} steps, {quiet} of {len(run.timed())} quiet"
        )
        if quiet >= 5 or attempt == a.retries or not _time_for(2 * run.wall_s, a):
            return run
        progress(f"disturbed by other processes (> {a.max_foreign:.0%} of the CPU): running again in 20 s")
        time.sleep(20)
    raise AssertionError("unreachable")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--per-worker-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--skip", type=int, default=3, help="steps not timed at the start of each run")
    ap.add_argument("--max-foreign", type=float, default=0.15, help="run again above this foreign CPU share")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--budget", type=float, default=900, help="seconds: no retry ends past this")
    ap.add_argument("--calibration-out", type=Path, default=None, help="write the calibration here")
    ap.add_argument("--cerebras-batch", type=int, default=32, help="samples per worker, Cerebras-like table")
    return ap.parse_args(argv)


CEREBRAS_MODEL = {  # GPT-3 XL's shape as a GPT-2: 1.3 B parameters
    "name": "gpt2",
    "vocab_size": 50257,
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_heads": 16,
    "max_position_embeddings": 2048,
    "fp16_type": "bfloat16",  # weights and gradients travel as bfloat16, as on a CS-2
}


def row(p: Prediction) -> dict[str, Any]:
    """One prediction, rounded for the JSON line."""
    return {
        "n": p.n,
        "step_s": round(p.step_s, 4),
        "tokens_per_s": round(p.tokens_per_s),
        "efficiency": round(p.efficiency, 4),
        "limit": p.limit,
        "overhead": overhead(p),
        "terms": {k: round(v, 4) for k, v in p.terms.items()},
    }


def cerebras_table(a: argparse.Namespace) -> dict[str, Any]:
    raw = {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": a.cerebras_batch,
            "max_sequence_length": 2048,
        },
        "model": CEREBRAS_MODEL,
        "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-4},
        "runconfig": {"max_steps": 1},
    }
    cluster = cerebras_like()
    workload = build_workload(load_params(raw), NS, cluster.swarmx_fanout, cluster.memoryx_shards)
    preds = predict(cluster, workload, NS)
    br = breaks_at(preds)
    # the same cluster if SwarmX took whole units before passing them on (store and forward)
    whole = predict(replace(cluster, relay="store_and_forward"), workload, NS)
    whole_br = breaks_at(whole)
    return {
        "model": workload.model,
        "per_worker_batch": workload.per_worker_batch,
        "assumed": list(cluster.notes),
        "rows": [row(p) for p in preds if p is not None],
        "breaks_at": br.n if br else None,
        "store_and_forward": {
            "breaks_at": whole_br.n if whole_br else None,
            "efficiency_192": round(next(p.efficiency for p in whole if p and p.n == 192), 3),
        },
    }


def resolved(raw: dict[str, Any]) -> Params:
    """``raw`` validated, for the model (its model_dir is never used: nothing runs from it)."""
    return load_params({**raw, "runconfig": {**raw["runconfig"], "model_dir": "unused"}})


def workload_of(raw: dict[str, Any], ns: list[int]) -> Workload:
    """The scaling model's workload of ``raw`` at each worker count of ``ns``."""
    params = resolved(raw)
    rc = params.runconfig
    return build_workload(params, ns, rc.swarmx_fanout, rc.num_wgt_servers)


def null_run_of(raw: dict[str, Any], run: Run, a: argparse.Namespace) -> NullRun:
    return NullRun(median_steps(run.step_rows(), a.skip), run.cpu_per_step(), workload_of(raw, [1]))


def measure_n1(a: argparse.Namespace, work: Path) -> tuple[Measurements, dict[str, Run]]:
    """Everything a calibration takes, all at N = 1 on this host: the in-process timings and four runs of
    the appliance ("null", "network_null", "tiny", "job"; see the module's docstring). Returns them as
    ``Measurements`` and the runs themselves (for their summaries)."""
    cores, b = os.cpu_count() or 1, a.per_worker_batch
    job = params_dict(a, 1, a.seq, b, a.steps)
    null = params_dict(a, 1, 1, 1, a.steps)
    # the same with every byte over gRPC on loopback: what the network data plane costs per byte
    network = {**null, "runconfig": {**null["runconfig"], "data_plane": "grpc"}}
    # as many units with ~1000x fewer bytes: what a transfer costs whatever its size
    tiny = {**null, "model": {**null["model"], "hidden_size": 64, "num_heads": 1, "vocab_size": 256}}
    tiny["model"]["max_position_embeddings"] = 16
    progress(f"timing a worker's units on 1..{cores} cores and MemoryX's update")
    by_cores = {k: timed_in_role_process(job, "units", "worker", k, b, a) for k in range(1, cores + 1)}
    update_rate = timed_in_role_process(job, "update", "memoryx", 1, 0, a)
    reduce_rate = timed_in_role_process(job, "reduce", "swarmx", 1, 0, a)
    progress("N=1 without compute (sequence 1, one sample): the transport in shared memory")
    runs = {"null": measured_run(null, work, a)}
    progress("N=1 without compute, every byte over gRPC on loopback: the network data plane")
    runs["network_null"] = measured_run(network, work, a)
    progress("N=1, a tiny model without compute: the latency of a transfer")
    runs["tiny"] = measured_run(tiny, work, a)
    progress("N=1: the job")
    runs["job"] = measured_run(job, work, a)
    rc = resolved(job).runconfig
    m = Measurements(
        host_cores=cores,
        unit_seconds_by_cores={k: [tuple(x) for x in v] for k, v in by_cores.items()},
        update_rate=update_rate,
        reduce_rate=reduce_rate,
        step_s=median_steps(runs["job"].step_rows(), a.skip),
        null=null_run_of(null, runs["null"], a),
        tiny=null_run_of(tiny, runs["tiny"], a),
        network_null=null_run_of(network, runs["network_null"], a),
        swarmx_fanout=rc.swarmx_fanout,
        memoryx_shards=rc.num_wgt_servers,
    )
    return m, runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    a.deadline = time.monotonic() + a.budget
    b = a.per_worker_batch
    job = params_dict(a, 1, a.seq, b, a.steps)
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        work = Path(tmp)
        m, n1 = measure_n1(a, work)
        runs = {1: n1["job"]}
        workload = workload_of(job, NS)
        cluster = calibrate(m, workload)
        preds = predict(cluster, workload, NS)
        for n in MEASURED_NS[1:]:  # measured to compare only: nothing of these goes into the model
            progress(f"N={n}: the job, {b} samples per worker")
            runs[n] = measured_run(params_dict(a, n, a.seq, b, a.steps), work, a)
    measured = {str(n): round(r.step_s(), 4) for n, r in runs.items()}
    predicted = {str(p.n): round(p.step_s, 4) for p in preds if p is not None}
    by_n = {p.n: p for p in preds if p is not None}
    calibration = {"cluster": cluster.to_dict(), "measured": m.to_dict(), "model": workload.model}
    if a.calibration_out is not None:
        a.calibration_out.write_text(json.dumps(calibration, indent=2))
    result = {
        "bench": "scaling",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "deadline"},
        "model": workload.model,
        "measured": measured,
        "predicted": predicted,
        "error": {n: round(predicted[n] / measured[n] - 1, 3) for n in measured},
        "efficiency_16": round(by_n[16].efficiency, 4),
        # the waits the model puts on the path (broadcast + reduce) next to the workers' own measure
        "worker_wait_s": {
            "measured": {str(n): r.summary()["worker_wait_s"] for n, r in runs.items()},
            "predicted": {
                str(n): round(by_n[n].terms["broadcast"] + by_n[n].terms["reduce"], 4) for n in runs
            },
        },
        "rows": [row(p) for p in preds if p is not None],
        "runs": {str(n): r.summary() for n, r in runs.items()},
        "null_run": n1["null"].summary(),
        "network_null_run": n1["network_null"].summary(),
        "tiny_null_run": n1["tiny"].summary(),
        "cluster": {k: v for k, v in cluster.to_dict().items() if k not in ("unit_seconds",)},
        "cerebras_like": cerebras_table(a),
    }
    print(json.dumps(record("scaling", result)), flush=True)
    return result


if __name__ == "__main__":
    main()

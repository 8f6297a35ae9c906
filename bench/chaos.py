"""Fault recovery under fire: the same GPT-2 job run fault-free, then with its role processes killed.

Both runs use the local backend in this process (JobRunner in a thread). During the second, an injector
thread waits for step events and, at scheduled steps, sends SIGKILL (and once SIGSTOP) to a role's
process: every kind of role, MemoryX included, the first MemoryX kill before any recovery snapshot or
checkpoint exists (a rollback to the seed's state). Prints one JSON line: faults by kind and signal,
restarts, recovery and detection time, steps replayed, the wall time of both runs, the cost of a fault in
fault-free steps (target <= 2.0), and whether the final checkpoint and every logged loss are bitwise equal.

    python bench/chaos.py [--steps 200 --faults 20 --rpc-timeout 10 --snapshot-steps 10 --replicas 1
                           --standby 1] [--smoke]
    python bench/chaos.py --hosts [--replicas 0|1] [--smoke]    (whole hosts on Slurm: bench/chaos_hosts.py)
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from machine import record  # bench/machine.py: the machine, date, command and commit
from safetensors.numpy import load_file

from weightstream.backends.base import RoleSpec, ready_file
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import load_params
from weightstream.plan import REPLICA, make_plan
from weightstream.training.events import JobEvent, RecoveredEvent, RestartEvent, RetryEvent, StepEvent
from weightstream.training.runner import JobRunner, RunSummary, job_log

KINDS = ("memoryx", "swarmx", "activation", "worker", REPLICA)  # the order faults rotate through
TARGET_COST_PER_FAULT_STEPS = 2.0
E = TypeVar("E", bound=JobEvent)


@dataclass(frozen=True)
class Injection:
    after_step: int  # sent once step ``after_step`` (1-based) is committed, while the next one runs
    role: str  # e.g. "memoryx-1"
    signal: str  # "SIGKILL" or "SIGSTOP"
    struck: str = ""  # the process it struck, as the backend names it (a failover swaps a shard's two)

    @property
    def kind(self) -> str:
        return self.role.rsplit("-", 1)[0]

    @property
    def spec(self) -> RoleSpec:
        kind, index = self.role.rsplit("-", 1)
        return RoleSpec(kind, int(index))


def fault_schedule(
    steps: int, faults: int, counts: dict[str, int], first_recovery_point: int, min_gap: int = 2
) -> list[Injection]:
    """``faults`` injections over a ``steps``-step job whose roles number ``counts`` (by kind).

    Kinds rotate memoryx, swarmx, activation, worker and, where the job has MemoryX replicas, a replica
    (indices in turn), so any 4 (5) in a row cover every kind. A "memoryx-<i>" fault strikes the process
    serving shard i when it strikes (after a failover, the one started as its replica). The first, a
    MemoryX kill, comes halfway to ``first_recovery_point`` (the first step with a snapshot or checkpoint),
    so that without replicas shard loss rolls back to the seed's state. The rest are evenly spaced
    at least ``min_gap`` committed steps apart: a role killed again before a step completes after its
    replacement fails the job (the runner takes it for a crash loop), and the gap also keeps one recovery
    from overlapping the next. The worker fault nearest the middle is a SIGSTOP (a hung role, found by its
    heartbeats). The last fault leaves at least ``min_gap`` steps to run."""
    kinds_here = [k for k in KINDS if counts.get(k, 0)]
    if faults < len(kinds_here):
        raise ValueError(f"faults={faults}: at least {len(kinds_here)} are needed to hit every kind of role")
    if first_recovery_point < 2:
        raise ValueError(
            f"the first snapshot or checkpoint is at step {first_recovery_point}: no room for a MemoryX "
            "kill before it (use --snapshot-steps 2 or more)"
        )
    first = first_recovery_point // 2
    gap = (steps - first) // faults
    if gap < min_gap:
        raise ValueError(
            f"{faults} faults after step {first} of {steps} are {gap} steps apart, fewer than {min_gap}: "
            "use more --steps or fewer --faults"
        )
    at = [first + i * gap for i in range(faults)]
    kinds = [kinds_here[i % len(kinds_here)] for i in range(faults)]
    workers = [i for i, k in enumerate(kinds) if k == "worker"]
    stop = min(workers, key=lambda i: abs(i - faults // 2))
    out = []
    for i, (step, kind) in enumerate(zip(at, kinds, strict=True)):
        index = (i // len(kinds_here)) % counts[kind]
        out.append(Injection(step, f"{kind}-{index}", "SIGSTOP" if i == stop else "SIGKILL"))
    return out


@dataclass
class Run:
    """What one run of the job left: its summary, its events (monotonic time, event) and injections."""

    model_dir: Path
    wall_s: float
    summary: RunSummary
    events: list[tuple[float, JobEvent]]
    injected: list[tuple[float, Injection, int]] = field(default_factory=list)  # (time, what, pid)

    def of(self, kind: type[E]) -> list[E]:
        return [e for _, e in self.events if isinstance(e, kind)]


class Chaos:
    """Records a run's events and, from its own thread, injects ``schedule`` into the backend's roles."""

    def __init__(self, schedule: list[Injection], backend: LocalProcessBackend, max_steps: int) -> None:
        self.schedule, self.backend, self.max_steps = schedule, backend, max_steps
        self.events: list[tuple[float, JobEvent]] = []
        self.injected: list[tuple[float, Injection, int]] = []
        self._cond = threading.Condition()
        self._step, self._finished = 0, False

    def on_event(self, e: JobEvent) -> None:
        t = time.monotonic()
        with self._cond:
            self.events.append((t, e))
            if isinstance(e, StepEvent):
                self._step = e.record.step
            self._cond.notify_all()
        match e:
            case StepEvent(record=r) if r.step % max(1, self.max_steps // 10) == 0:
                progress(f"step {r.step}/{self.max_steps} loss {r.loss:.4f} {r.step_time_s:.2f}s/step")
            case RestartEvent() | RetryEvent():
                progress(f"{e.kind} at step {e.step}: {e.reason.split('; its log')[0]}")
            case RecoveredEvent():
                progress(f"recovered at step {e.step} in {e.recovery_s:.2f}s, replay {e.replay_steps}")

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def _reached(self, step: int) -> bool:
        """Whether the run got to ``step`` (or finished); read under ``_cond``."""
        return self._finished or self._step >= step

    def _serving(self, role: RoleSpec) -> RoleSpec:
        """The process that serves ``role`` now: a shard or a replica may be served by the process started
        as the other (a failover), which the newest recovery's addresses tell."""
        if role.kind not in ("memoryx", REPLICA):
            return role
        with self._cond:
            recovered = [e for _, e in self.events if isinstance(e, RecoveredEvent)]
        if not recovered:
            return role
        address = recovered[-1].addresses[role.kind][role.index]
        for candidate in (RoleSpec("memoryx", role.index), RoleSpec(REPLICA, role.index)):
            ready = json.loads(ready_file(self.backend.run_dir, candidate).read_text())
            if ready["address"] == address:
                return candidate
        raise RuntimeError(f"no process of {role.name} serves at {address}")

    def inject(self) -> None:
        for inj in self.schedule:
            with self._cond:
                self._cond.wait_for(partial(self._reached, inj.after_step))
                if self._finished:
                    return
            # the role's current process: a replacement's Popen takes its place in ``procs``, and the
            # schedule's spacing means it has been serving steps for a while already
            process = self._serving(inj.spec)
            pid = self.backend.procs[process].pid
            os.kill(pid, getattr(signal, inj.signal))
            self.injected.append((time.monotonic(), replace(inj, struck=process.name), pid))
            progress(f"{inj.signal} {inj.role} (pid {pid}) after step {inj.after_step}")


def progress(line: str) -> None:
    print(f"[chaos] {line}", file=sys.stderr, flush=True)


def run_job(raw: dict[str, Any], model_dir: Path, schedule: list[Injection]) -> Run:
    """Run the job of ``raw`` in ``model_dir`` with ``schedule`` injected (empty: fault-free)."""
    raw = json.loads(json.dumps(raw))
    raw["runconfig"]["model_dir"] = str(model_dir)
    params = load_params(raw)
    backend = LocalProcessBackend(model_dir / "logs")
    chaos = Chaos(schedule, backend, params.runconfig.max_steps)
    out: dict[str, Any] = {}

    def train() -> None:
        try:
            with job_log(model_dir, model_dir.name):
                out["summary"] = JobRunner(params, backend, chaos.on_event, job_id=model_dir.name).run()
        except BaseException as e:  # handed to the main thread, which raises it
            out["error"] = e
        finally:
            chaos.finish()

    t0 = time.monotonic()
    trainer = threading.Thread(target=train, name=f"runner-{model_dir.name}")
    trainer.start()
    chaos.inject()
    trainer.join()
    wall = time.monotonic() - t0
    if "error" in out:
        raise RuntimeError(f"the {model_dir.name} run failed (logs in {model_dir})") from out["error"]
    return Run(model_dir, wall, out["summary"], chaos.events, chaos.injected)


# -- comparing the two runs ----------------------------------------------------------------------------
def checkpoints_equal(a: Path, b: Path) -> bool:
    """Whether every tensor of every model and optimizer file of checkpoints ``a`` and ``b`` is equal
    (same names, dtypes, shapes and bits)."""
    files = sorted(p.name for p in a.glob("*.safetensors"))
    if not files or files != sorted(p.name for p in b.glob("*.safetensors")):
        return False
    for name in files:
        x, y = load_file(a / name), load_file(b / name)
        if x.keys() != y.keys():
            return False
        if any(x[k].dtype != y[k].dtype or not np.array_equal(x[k], y[k]) for k in x):
            return False
    return True


def logged_losses(model_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def detection_s(
    injected: list[tuple[float, Injection, int]], events: list[tuple[float, JobEvent]]
) -> list[float | None]:
    """For each injection, seconds until the runner's first "restart" event for that role after it
    (None: never detected)."""
    out: list[float | None] = []
    for t, inj, _ in injected:
        role = inj.struck or inj.role
        later = [te for te, e in events if isinstance(e, RestartEvent) and e.role == role and te >= t]
        out.append(min(later) - t if later else None)
    return out


def cost_per_fault_steps(faulty_wall_s: float, fault_free_wall_s: float, faults: int, step_s: float) -> float:
    """The wall time the faults added, per fault, in fault-free steps."""
    return (faulty_wall_s - fault_free_wall_s) / faults / step_s


def lost_in_run(step_times: list[float], fault_times: list[float]) -> tuple[float, list[float | None]]:
    """(the run's normal step: the median gap between committed steps with no fault in between; for each
    fault, how much longer than that the run took to commit the step after it: detection, replacement,
    reconfiguration, replay and the step's second run; None where no step followed). Measured within one
    run, so unlike the wall-time difference of two runs it does not move with the load that other work
    puts on the machine between them. bench/chaos_hosts.py measures host faults the same way."""
    spans = list(itertools.pairwise(step_times))
    clean = [b - a for a, b in spans if not any(a <= f < b for f in fault_times)]
    normal = statistics.median(clean) if clean else 0.0
    out: list[float | None] = []
    for f in fault_times:
        around = [b - a for a, b in spans if a <= f < b]
        out.append(around[0] - normal if around else None)
    return normal, out


def lost_s(
    injected: list[tuple[float, Injection, int]], events: list[tuple[float, JobEvent]]
) -> tuple[float, list[float | None]]:
    """``lost_in_run`` of this run's step events and injections."""
    return lost_in_run([t for t, e in events if isinstance(e, StepEvent)], [t for t, _, _ in injected])


def _replays_after(run: Run, kind: str) -> int:
    """Steps replayed by the recoveries that followed the injections into roles of ``kind``."""
    hits = sorted(t for t, inj, _ in run.injected if inj.kind == kind)
    recovered = [(t, e) for t, e in run.events if isinstance(e, RecoveredEvent)]
    return sum(next((e.replay_steps for t, e in recovered if t >= h), 0) for h in hits)


def _median_step_s(run: Run) -> float:
    times = [e.record.step_time_s for e in run.of(StepEvent)]
    return statistics.median(times[1:] or times)  # the first warms caches up


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def summarize(base: Run, faulty: Run) -> dict[str, Any]:
    mean_step = statistics.fmean(e.record.step_time_s for e in base.of(StepEvent))
    injected = [inj for _, inj, _ in faulty.injected]
    detect = detection_s(faulty.injected, faulty.events)
    kills = [t for t, i in zip(detect, injected, strict=True) if t is not None and i.signal == "SIGKILL"]
    stops = [t for t, i in zip(detect, injected, strict=True) if t is not None and i.signal == "SIGSTOP"]
    cost = cost_per_fault_steps(faulty.wall_s, base.wall_s, max(1, len(injected)), mean_step)
    normal, lost = lost_s(faulty.injected, faulty.events)
    known = [x for x in lost if x is not None]
    cost_in_run = statistics.fmean(known) / normal if known and normal else None

    def lost_mean(sig: str, kind: str | None = None) -> float | None:
        xs = [
            x
            for x, i in zip(lost, injected, strict=True)
            if x is not None and i.signal == sig and kind in (None, i.kind)
        ]
        return statistics.fmean(xs) if xs else None

    restarts, recovered = faulty.of(RestartEvent), faulty.of(RecoveredEvent)
    assert base.summary.checkpoint is not None and faulty.summary.checkpoint is not None
    target = TARGET_COST_PER_FAULT_STEPS
    return {
        "faults": {
            "total": len(injected),
            "by_kind": {k: sum(i.kind == k for i in injected) for k in KINDS},
            "by_signal": {s: sum(i.signal == s for i in injected) for s in ("SIGKILL", "SIGSTOP")},
            "schedule": [f"{i.after_step}:{i.role}:{i.signal}" for i in injected],
        },
        "restarts": faulty.summary.restarts,
        "restarts_by_kind": {k: sum(e.role_kind == k for e in restarts) for k in KINDS},
        "retries": len(faulty.of(RetryEvent)),
        "recoveries": len(recovered),
        "recovery_s_total": round(sum(e.recovery_s for e in recovered), 3),
        "recovery_s_median": _r(statistics.median([e.recovery_s for e in recovered]) if recovered else None),
        "replay_steps_total": sum(e.replay_steps for e in recovered),
        "replay_steps_after_memoryx_faults": _replays_after(faulty, "memoryx"),
        "undetected_faults": sum(t is None for t in detect),
        "detection_s_sigkill_median": _r(statistics.median(kills) if kills else None),
        "detection_s_sigkill_max": _r(max(kills) if kills else None),
        "detection_s_sigstop": _r(stops[0] if stops else None),
        "lost_s_per_sigkill_by_kind": {k: _r(lost_mean("SIGKILL", k)) for k in KINDS},
        "lost_s_sigstop": _r(lost_mean("SIGSTOP")),
        "wall_s_fault_free": round(base.wall_s, 2),
        "wall_s_faulty": round(faulty.wall_s, 2),
        "slowdown": round(faulty.wall_s / base.wall_s, 3),
        "fault_free_step_s_median": round(_median_step_s(base), 4),
        "fault_free_step_s_mean": round(mean_step, 4),
        # far from 1: the machine's load changed between the runs, and the wall-time cost with it
        "step_s_ratio_faulty_over_fault_free": round(_median_step_s(faulty) / _median_step_s(base), 3),
        "cost_per_fault_in_steps": round(cost, 2),
        "cost_per_fault_in_steps_in_run": _r(cost_in_run, 2),
        "cost_per_fault_target": target,
        "cost_per_fault_target_met": {
            "wall": cost <= target,
            "in_run": cost_in_run is not None and cost_in_run <= target,
        },
        "bitwise_equal": checkpoints_equal(base.summary.checkpoint, faulty.summary.checkpoint),
        "losses_equal": logged_losses(base.model_dir) == logged_losses(faulty.model_dir),
        "final_step": faulty.summary.final_step,
    }


# -- the job -------------------------------------------------------------------------------------------
def params_dict(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": a.batch,
            "max_sequence_length": a.seq,
            "shuffle_seed": 3,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": a.hidden,
            "num_hidden_layers": a.layers,
            "num_heads": max(1, a.hidden // 64),
            "max_position_embeddings": a.seq,
        },
        "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-4, "max_gradient_norm": 1.0},
        "runconfig": {
            "max_steps": a.steps,
            "autoload_last_checkpoint": False,  # a --keep directory run again starts over
            "log_steps": 1,
            "checkpoint_steps": a.checkpoint_steps,
            "recovery_snapshot_steps": a.snapshot_steps,
            "num_csx": a.workers,
            "num_wgt_servers": a.shards,
            "rpc_timeout_s": a.rpc_timeout,
            "max_role_restarts": max(50, 2 * a.faults),
            "memoryx_replicas": a.replicas,
            "standby_roles": a.standby,
            "seed": 1,
        },
    }


SMOKE: dict[str, float] = {
    "hidden": 32,
    "layers": 2,
    "seq": 16,
    "batch": 8,
    "vocab": 64,
    "steps": 40,
    "faults": 5,
}
SMOKE.update(rpc_timeout=5.0, snapshot_steps=6, checkpoint_steps=20)


def add_job_args(ap: argparse.ArgumentParser) -> None:
    """The job's options that this bench and the hosts bench (bench/chaos_hosts.py) share."""
    ap.add_argument("--rpc-timeout", type=float, default=10.0, help="runconfig.rpc_timeout_s")
    ap.add_argument("--snapshot-steps", type=int, default=10, help="runconfig.recovery_snapshot_steps")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--replicas", type=int, default=1, choices=(0, 1), help="runconfig.memoryx_replicas")
    ap.add_argument("--keep", type=Path, default=None, help="leave both runs' model_dirs here")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--checkpoint-steps", type=int, default=100)
    add_job_args(ap)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument(
        "--standby",
        type=int,
        default=1,
        help="runconfig.standby_roles (0: each replacement starts a process)",
    )
    ap.add_argument("--smoke", action="store_true", help="a tiny model and 5 faults: well under a minute")
    a = ap.parse_args(argv)
    if a.smoke:
        smoke_defaults(ap, a, SMOKE)
    return a


def smoke_defaults(ap: argparse.ArgumentParser, a: argparse.Namespace, smoke: dict[str, Any]) -> None:
    """``smoke``'s values in ``a`` wherever the command line left an option at its default: what it set
    wins."""
    for key, value in smoke.items():
        if ap.get_default(key) == getattr(a, key):
            setattr(a, key, value)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    given = sys.argv[1:] if argv is None else argv
    if "--hosts" in given:  # host faults on emulated Slurm hosts: a bench of its own
        import chaos_hosts

        hosts_result: dict[str, Any] = chaos_hosts.main([x for x in given if x != "--hosts"])
        return hosts_result
    a = parse_args(argv)
    raw = params_dict(a)
    params = load_params({**raw, "runconfig": {**raw["runconfig"], "model_dir": "unused"}})
    counts = make_plan(params).counts()
    points = [p for p in (a.snapshot_steps, a.checkpoint_steps) if p > 0]
    schedule = fault_schedule(a.steps, a.faults, counts, min([*points, a.steps]))
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        work = a.keep or Path(tmp)
        progress(f"fault-free run: {a.steps} steps, roles {counts}")
        base = run_job(raw, work / "fault_free", [])
        progress(f"faulty run: {len(schedule)} faults")
        faulty = run_job(raw, work / "faulty", schedule)
        result = {
            "bench": "chaos",
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "roles": counts,
            "rpc_timeout_s": a.rpc_timeout,
            **summarize(base, faulty),
        }
    line = record("chaos", result)
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    main()

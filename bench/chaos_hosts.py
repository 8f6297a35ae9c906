"""Host faults on emulated Slurm hosts: the chaos bench's GPT-2 job fault-free, then with whole hosts lost,
links cut for 30 s and one link slowed; ``python bench/chaos.py --hosts`` runs it.

Builds ten emulated hosts (testbed/, every link at 1 Gbit/s) and a real Slurm cluster on them, and runs
the job in one allocation of all ten (``salloc --no-kill``: a lost node takes its roles, not the job):
workers on nodes of their own, the servers apart, each replica apart from its shard, and free nodes for
replacements. The coordinator runs where a user's would (the switch's network namespace, ``drive``
below) and writes every event, timed, for this process to follow. The faults, in this order, each once
the previous has been recovered from and a few steps have run since:

- ``slow_link``: worker-1's host's link at 1/20 of the others' (50 Mbit/s) for a few steps; the job's
  step records name the straggler, and a ``straggler`` event says so once;
- ``host_loss`` (3): the hosts of worker-1, of the process serving MemoryX shard 0, and of SwarmX node 0
  killed: every process on it and its slurmd;
- ``partition`` (2): the links of the hosts of worker-0 and of the process serving MemoryX shard 1 cut,
  and restored 30 s later; their roles must be replaced meanwhile, and their old steps must be gone
  once the link is back (Slurm's step list and the host's processes are watched).

Prints one JSON line: each fault's host, roles, detection (from the fault to the first restart event of
a role on that host), when Slurm saw the node not responding and down, the time it cost in the run's own
step time (``lost_s``, and in steps), where its roles went; the straggler's per-step ratios; and whether
the final checkpoint and every logged loss are bitwise those of the fault-free run. The target: a host
loss costs at most Slurm's detection time (SlurmdTimeout) plus 2 step-times.

    python bench/chaos.py --hosts [--replicas 0|1] [--steps 100 --rpc-timeout 10]    (root, Slurm)
    python bench/chaos.py --hosts --smoke              (a tiny model; a slow link, a host, a partition)
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
from pathlib import Path
from typing import Any

from machine import ROOT, record  # bench/machine.py: the machine, date, command and commit

sys.path.insert(0, str(ROOT))  # testbed/ lives at the repository's root, beside bench/
import chaos  # bench/chaos.py: the job, and the comparison of two runs; bench/host_faults.py: the faults
from host_faults import (
    PLAN,
    SMOKE_PLAN,
    HostFault,
    Injector,
    RunLog,
    steps_for,
)  # bench/host_faults.py

from testbed import EmulatedHosts
from testbed.slurm import SLURMD_TIMEOUT, SlurmCluster

HOSTS = 10  # 2 workers, 3 servers, 2 replicas, and room for the replacements of 5 lost nodes
LINK_RATE = "1gbit"
PYTHONPATH = os.pathsep.join(str(ROOT / d) for d in ("services", "client"))
RUN_TIMEOUT_S = 1200.0


def progress(line: str) -> None:
    print(f"[chaos-hosts] {line}", file=sys.stderr, flush=True)


# -- the coordinator, inside the allocation -------------------------------------------------------------
def drive(params_file: Path, events_file: Path) -> int:
    """Run the job of ``params_file`` (JSON) on the Slurm backend, inside the allocation salloc made,
    appending each event to ``events_file`` as ``{"t": monotonic seconds, "event": kind, ...}``."""
    from weightstream.backends.slurm.backend import SlurmBackend
    from weightstream.params import load_params
    from weightstream.training.events import JobEvent
    from weightstream.training.runner import JobFailed, JobRunner, job_log

    params = load_params(json.loads(params_file.read_text()))
    model_dir = Path(params.runconfig.model_dir)
    with open(events_file, "a", buffering=1) as out:

        def on_event(e: JobEvent) -> None:
            out.write(json.dumps({"t": time.monotonic(), **e.to_dict()}) + "\n")

        try:
            with job_log(model_dir, model_dir.name):
                JobRunner(params, SlurmBackend(model_dir / "logs"), on_event, job_id=model_dir.name).run()
        except JobFailed as e:
            out.write(json.dumps({"t": time.monotonic(), "event": "failed", "reason": str(e)}) + "\n")
            return 1
    return 0


def run_job(
    slurm: SlurmCluster, raw: dict[str, Any], model_dir: Path, plan: tuple[HostFault, ...]
) -> tuple[RunLog, Injector | None]:
    """Run ``raw`` in ``model_dir`` in an allocation of every node, injecting ``plan`` (empty: fault-free)."""
    model_dir.mkdir(parents=True)
    raw = {**raw, "runconfig": {**raw["runconfig"], "model_dir": str(model_dir)}}
    params_file, events = model_dir / "params.json", model_dir / "events.jsonl"
    params_file.write_text(json.dumps(raw))
    argv = ["salloc", "--no-kill", "--exclusive", f"--nodes={len(slurm.hosts)}", "--job-name=chaos-hosts",
            "--immediate=60", sys.executable, str(Path(__file__).resolve()), "drive", str(params_file),
            str(events)]  # fmt: skip
    log = RunLog(events)
    injector = Injector(slurm, log, model_dir / "logs", plan, LINK_RATE) if plan else None
    with open(model_dir / "salloc.log", "wb") as said:
        proc = subprocess.Popen(
            slurm.command(argv),
            env={**slurm.env, "PYTHONPATH": PYTHONPATH},
            stdout=said,
            stderr=subprocess.STDOUT,
        )
        try:
            if injector is not None:
                injector.run(lambda: proc.poll() is not None)
            proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            log.close()
    if proc.returncode != 0:
        tail = (model_dir / "salloc.log").read_text()[-3000:]
        failed = f"the {model_dir.name} run failed (exit {proc.returncode}; logs in {model_dir})"
        raise RuntimeError(f"{failed}:\n{tail}")
    return log, injector


# -- the summary ---------------------------------------------------------------------------------------
def _r(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _gathered(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One kind of fault's entries, with each figure listed across them (in order) and its worst."""
    out: dict[str, Any] = {"count": len(entries)}
    for key in ("detection_s", "lost_s", "cost_in_steps"):
        out[key] = [e[key] for e in entries]
        out[f"{key}_max"] = max((x for x in out[key] if x is not None), default=None)
    if entries and "target_met" in entries[0]:
        out["target_s"] = entries[0]["target_s"]
        out["target_met"] = [e["target_met"] for e in entries]
        out["all_within_target"] = all(out["target_met"])
    if entries and "old_steps_left_after_restore" in entries[0]:
        out["old_steps_left_after_restore"] = [e["old_steps_left_after_restore"] for e in entries]
        out["old_steps_left_total"] = sum(x or 0 for x in out["old_steps_left_after_restore"])
        out["replaced_before_restore"] = all(e["replaced_before_restore"] for e in entries)
    return {**out, "each": entries}


def summarize(
    base: RunLog, faulty: RunLog, injector: Injector, base_dir: Path, faulty_dir: Path
) -> dict[str, Any]:
    """The figures of the JSON line from both runs' events and the faults injected into the second."""
    normal, lost = chaos.lost_in_run(faulty.step_times(), [f.at for f in injector.done])
    target = SLURMD_TIMEOUT + 2 * normal
    out: dict[str, Any] = {"host_loss": [], "partition": []}
    for fault, extra in zip(injector.done, lost, strict=True):
        if fault.what == "slow_link":
            continue
        restart = faulty.first_restart(fault.roles, fault.at)
        detection = restart - fault.at if restart is not None else None
        entry: dict[str, Any] = {
            "host": fault.host,
            "roles": fault.roles,
            "after_step": fault.after_step,
            "detection_s": _r(detection),
            "slurm_not_responding_s": _r(fault.slurm_not_responding_s),
            "slurm_down_s": _r(fault.slurm_down_s),
            "lost_s": _r(extra),
            "cost_in_steps": _r(extra / normal if extra is not None and normal else None),
            "replay_steps": faulty.replay_after(fault.at),
            "replaced_on": fault.replaced_on,
        }
        entry["coordinator_first"] = (
            detection is not None
            and fault.slurm_not_responding_s is not None
            and detection < fault.slurm_not_responding_s
        )
        if fault.what == "host_loss":
            entry["target_s"] = round(target, 2)
            entry["target_met"] = extra is not None and extra <= target
        else:
            entry["replaced_before_restore"] = restart is not None and restart < fault.at + fault.cut_s
            entry["old_steps_left_after_restore"] = fault.old_steps_left
            entry["old_steps_gone_s_after_restore"] = _r(fault.old_steps_gone_s)
            entry["old_processes_left_after_restore"] = fault.old_processes_left
        out[fault.what].append(entry)
    slow = next((f for f in injector.done if f.what == "slow_link"), None)
    if slow is not None:
        ratios = faulty.ratios(slow.worker_index, slow.after_step, slow.until_step)
        said = faulty.stragglers()
        out["slow_link"] = {
            "host": slow.host,
            "worker": slow.roles[0],
            "rate": f"{LINK_RATE} / {injector.slow_divisor}",
            "steps": [slow.after_step + 1, slow.until_step],
            "slowest_worker_ratio_per_step": [round(r, 2) for r in ratios],
            "ratio_median": _r(statistics.median(ratios) if ratios else None),
            "straggler_events": said,
        }
    for what in ("host_loss", "partition"):
        out[what] = _gathered(out[what])
    base_ckpt, faulty_ckpt = base.final_checkpoint(), faulty.final_checkpoint()
    return {
        **out,
        "step_s_normal_in_run": round(normal, 3),
        "step_s_fault_free_median": round(statistics.median(base.step_durations()[1:]), 3),
        "wall_s_fault_free": round(base.wall_s(), 1),
        "wall_s_faulty": round(faulty.wall_s(), 1),
        # the fault-free run's: its workers share the machine's cores, so one is 1.4x the other at the
        # median, and now and then 1.5x for three steps running
        "straggler_events_fault_free": len(base.stragglers()),
        "restarts": faulty.count("restart"),
        "recoveries": faulty.count("recovered"),
        # slurmctld pings every SlurmdTimeout/3: a node is "not responding" after a failed ping, DOWN once
        # it has not answered for SlurmdTimeout
        "slurmd_timeout_s": SLURMD_TIMEOUT,
        "target": "lost_s of a host loss <= SlurmdTimeout + 2 step-times",
        "bitwise_equal": base_ckpt is not None
        and faulty_ckpt is not None
        and chaos.checkpoints_equal(base_ckpt, faulty_ckpt),
        "losses_equal": chaos.logged_losses(base_dir) == chaos.logged_losses(faulty_dir),
        "final_step": faulty.final_step(),
    }


# -- the job -------------------------------------------------------------------------------------------
SMOKE: dict[str, float] = {"hidden": 128, "layers": 2, "seq": 64, "batch": 8, "vocab": 1024}
PROBE_STEPS = 8  # a fault-free job this long gives the step time that sizes the runs (--steps unset)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="default: what the faults need at this step time")
    chaos.add_job_args(ap)
    ap.add_argument("--smoke", action="store_true", help="a tiny model; a slow link, a host, a partition")
    a = ap.parse_args(argv)
    if a.smoke:
        chaos.smoke_defaults(ap, a, SMOKE)
    a.workers, a.shards, a.faults = 2, 2, len(SMOKE_PLAN if a.smoke else PLAN)
    a.checkpoint_steps = 0  # one checkpoint, the last: the one both runs are compared by
    a.standby = 0  # runconfig.standby_roles: the Slurm backend keeps no spare steps
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    plan = SMOKE_PLAN if a.smoke else PLAN
    with tempfile.TemporaryDirectory(prefix="chaos-hosts-") as tmp:
        work = a.keep or Path(tmp)
        progress(f"{HOSTS} emulated hosts, links at {LINK_RATE}, and a Slurm cluster on them")
        with EmulatedHosts(HOSTS, rate=LINK_RATE) as hosts, SlurmCluster(hosts) as slurm:
            if a.steps is None:
                probe = {**chaos.params_dict(a), "runconfig": {**chaos.params_dict(a)["runconfig"]}}
                probe["runconfig"]["max_steps"] = PROBE_STEPS
                step_s = statistics.median(run_job(slurm, probe, work / "probe", ())[0].step_durations()[2:])
                a.steps = steps_for(plan, step_s)
                progress(f"{step_s:.3f} s a step: {a.steps} steps hold the faults")
            raw = chaos.params_dict(a)
            progress(f"fault-free run: {a.steps} steps, memoryx_replicas {a.replicas}")
            base, _ = run_job(slurm, raw, work / "fault_free", ())
            progress(f"faulty run: {', '.join(f'{f.what} ({f.role})' for f in plan)}")
            faulty, injector = run_job(slurm, raw, work / "faulty", plan)
            assert injector is not None
            if len(injector.done) < len(plan):
                raise RuntimeError(
                    f"the job ended after {len(injector.done)} of {len(plan)} faults: use more --steps"
                )
            strays = slurm.strays(grace_s=10)
            result = {
                "bench": "chaos_hosts",
                "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                "hosts": HOSTS,
                "link_rate": LINK_RATE,
                "rpc_timeout_s": a.rpc_timeout,
                "memoryx_replicas": a.replicas,
                "placement": json.loads((work / "faulty" / "logs" / "placement.json").read_text())["roles"],
                **summarize(base, faulty, injector, work / "fault_free", work / "faulty"),
                "processes_left_on_hosts": len(strays),
            }
    given = sys.argv[1:] if argv is None else argv
    line = record("chaos_hosts", result, ["bench/chaos.py", "--hosts", *given])
    print(json.dumps(line), flush=True)
    return line


if __name__ == "__main__":
    if sys.argv[1:2] == ["drive"]:
        sys.exit(drive(Path(sys.argv[2]), Path(sys.argv[3])))
    main()

"""Weight streaming across emulated hosts: link use, the network path's cost, and the simulator's error.

Builds its own emulated hosts (testbed/: namespaces, a bridge, ``tc tbf`` links) and a real Slurm cluster
on them, removes both at the end, and prints one JSON line; every figure is a ratio of two measurements
taken in this run:
- ``broadcast_link_ratio_1gbit``: a MemoryX shard on h1, a SwarmX node on h2 and two readers (h3, h4)
  fetching one GPT-2 block through SwarmX (checksums checked), every host's outgoing link limited to
  1 Gbit/s: the bytes per second crossing the busiest link over the link rate (125 MB/s). Target >= 0.8;
- ``cross_host_step_ratio``: bench/scaling.py's job (GPT-2 d512, L4, V8192, T256, 8 samples per worker)
  at ``num_csx 2`` placed by ``weightstream run --backend slurm`` on four hosts (each worker on its own,
  links unlimited, tensors over the network plane) over the same job with every role on this host
  (shared memory). Target <= 1.15. The emulated hosts share this machine's cores: what the network plane
  costs in copies and framing comes out of the workers' compute;
- ``simulate_max_error``: the scaling model calibrated exactly as bench/scaling.py calibrates it (N = 1 on
  one host; its null run over gRPC on loopback gives the network data plane's cost per byte and bandwidth
  per hop), then asked for that job across hosts, roles over the network plane, with unlimited links and
  at 1 Gbit/s (every link, the MemoryX and SwarmX bandwidths capped at 125 MB/s: ``weightstream simulate
  --calibration FILE --data-plane network --link-bandwidth 1.25e8 --swarmx-bandwidth 1.25e8``): the
  larger |predicted - measured| / measured of the two, both measured here. Target <= 0.15.

    python bench/hosts.py [--steps 16 --skip 3 --repeats 5]     (root, Slurm; about 15 minutes here)
    python bench/hosts.py --quick                                 (a tiny model: the bench's plumbing)
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from machine import ROOT, record  # bench/machine.py: the machine, date, command and commit

sys.path.insert(0, str(ROOT))  # testbed/ lives at the repository's root, beside bench/
import scaling  # bench/scaling.py: the job, its calibration and its one-host runs
from broadcast_hosts import broadcast  # bench/broadcast_hosts.py

from testbed import EmulatedHosts, parse_rate
from testbed.slurm import SlurmCluster
from weightstream.simulate.calibrate import calibrate, median_steps, read_metrics
from weightstream.simulate.cluster import Cluster
from weightstream.simulate.model import predict_one
from weightstream.simulate.workload import Workload

LINK_RATE = "1gbit"
TARGETS = {"broadcast_link_ratio_1gbit": 0.8, "cross_host_step_ratio": 1.15, "simulate_max_error": 0.15}
PYTHONPATH = os.pathsep.join(str(ROOT / d) for d in ("services", "client"))
QUICK = shlex.split(
    "--hidden 128 --layers 2 --vocab 1024 --seq 32 --steps 6 --skip 2 --retries 0"
)  # a tiny job: the plumbing in about a minute
QUICK_BROADCAST = {"bw_hidden": 256, "repeats": 2}


def progress(line: str) -> None:
    print(f"[hosts] {line}", file=sys.stderr, flush=True)


# -- the pure parts ------------------------------------------------------------------------------------------
def busiest_link(sent: dict[str, int], seconds: float, rate: str) -> tuple[str, float]:
    """(the host whose link sent the most, its bytes per second over the link's rate in bytes per second)
    from each host's bytes sent during ``seconds``."""
    if seconds <= 0 or not sent:
        raise ValueError(f"a link's use needs bytes and a duration > 0: {sent}, {seconds} s")
    host = max(sent, key=lambda h: sent[h])
    return host, sent[host] / seconds / (parse_rate(rate) / 8)


def at_link_rate(cluster: Cluster, bytes_per_s: float) -> Cluster:
    """``cluster`` with every host's link limited to ``bytes_per_s``: a hop, a MemoryX shard and a SwarmX
    node (which sends all its children's copies through its one link) move no more than that."""
    return replace(
        cluster,
        link_bandwidth=min(cluster.link_bandwidth, bytes_per_s),
        memoryx_bandwidth=min(cluster.memoryx_bandwidth, bytes_per_s),
        swarmx_bandwidth=min(cluster.swarmx_bandwidth, bytes_per_s),
    )


def predicted_across_hosts(cluster: Cluster, workload: Workload, link_bytes: float) -> dict[str, float]:
    """Seconds per step at N = 2 with the roles on separate hosts, over the network data plane (the
    calibration's figures from its run over gRPC): links unlimited, and every link at ``link_bytes``
    bytes/s (``LINK_RATE``)."""
    if not cluster.has_network_figures:
        raise ValueError(
            f"cluster {cluster.name!r} has no network-plane figures: calibrate with its gRPC run"
        )
    net = cluster.over_network()
    steps = {
        "unlimited": predict_one(net, workload, 2),
        LINK_RATE: predict_one(at_link_rate(net, link_bytes), workload, 2),
    }
    return {k: p.step_s for k, p in steps.items() if p is not None}


def relative_errors(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """|predicted - measured| / measured for every case measured."""
    return {k: abs(predicted[k] - m) / m for k, m in measured.items()}


def figures(
    broadcast_ratio: float, cross_s: float, local_s: float, errors: dict[str, float]
) -> dict[str, Any]:
    """The three headline figures, rounded, and whether each meets its target."""
    out = {
        "broadcast_link_ratio_1gbit": round(broadcast_ratio, 3),
        "cross_host_step_ratio": round(cross_s / local_s, 3),
        "simulate_max_error": round(max(errors.values()), 3),
    }
    meets = {
        "broadcast_link_ratio_1gbit": out["broadcast_link_ratio_1gbit"]
        >= TARGETS["broadcast_link_ratio_1gbit"],
        "cross_host_step_ratio": out["cross_host_step_ratio"] <= TARGETS["cross_host_step_ratio"],
        "simulate_max_error": out["simulate_max_error"] <= TARGETS["simulate_max_error"],
    }
    return {**out, "targets": TARGETS, "meets_targets": meets}


# -- the job on Slurm ----------------------------------------------------------------------------------------
def slurm_step_s(
    slurm: SlurmCluster, raw: dict[str, Any], work: Path, name: str, a: argparse.Namespace
) -> tuple[float, dict[str, str]]:
    """(median step time after ``--skip``, role -> host) of ``weightstream run --backend slurm`` of ``raw``,
    started where a user of the cluster starts it; each role on the node its placement names."""
    model_dir = work / name
    model_dir.mkdir()
    path = model_dir / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    argv = [
        sys.executable,
        "-m",
        "weightstream.cli",
        "run",
        str(path),
        "--num_csx",
        str(raw["runconfig"]["num_csx"]),
        "--model_dir",
        str(model_dir),
        "--backend",
        "slurm",
    ]
    done = slurm.run(
        argv,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        env={"PYTHONPATH": PYTHONPATH, "COLUMNS": "200"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"weightstream run --backend slurm failed: {done.stderr[-3000:]}")
    placed = json.loads((model_dir / "logs" / "placement.json").read_text())["roles"]
    progress(f"{name}: roles on {placed}")
    return median_steps(read_metrics(model_dir / "metrics.jsonl"), a.skip), placed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model and few steps: checks the plumbing")
    ap.add_argument("--bw-hidden", type=int, default=1024, help="hidden size of the block broadcast")
    ap.add_argument("--repeats", type=int, default=5, help="broadcasts of the block, each to both readers")
    own, rest = ap.parse_known_args(argv)
    # the job, the steps, the retry rules; retries end 10 minutes in (not scaling.py's 15), leaving the
    # broadcast and the two runs across hosts (about 4 minutes here) inside the 20
    a = scaling.parse_args(["--budget", "600", *(QUICK if own.quick else []), *rest])
    a.quick, a.deadline = own.quick, time.monotonic() + a.budget
    a.bw_hidden, a.repeats = own.bw_hidden, own.repeats
    if own.quick:
        a.bw_hidden, a.repeats = QUICK_BROADCAST["bw_hidden"], QUICK_BROADCAST["repeats"]
    return a


def calibrated(a: argparse.Namespace, work: Path) -> tuple[Cluster, Workload, float]:
    """(the cluster calibrated as bench/scaling.py does, from N = 1 on this host, network-plane figures
    included; the job's workload at N = 2; the job's step at N = 2 on this host, every role here: the
    shared-memory baseline)."""
    progress("calibrating as bench/scaling.py does: unit timings, update, reduce, four N=1 runs")
    m, _ = scaling.measure_n1(a, work)
    job = scaling.params_dict(a, 1, a.seq, a.per_worker_batch, a.steps)
    workload = scaling.workload_of(job, [1, 2])
    cluster = calibrate(m, workload)
    progress("N=2 on this host (shared memory): the baseline")
    local = scaling.measured_run(scaling.params_dict(a, 2, a.seq, a.per_worker_batch, a.steps), work, a)
    return cluster, workload, local.step_s()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    job2 = scaling.params_dict(a, 2, a.seq, a.per_worker_batch, a.steps)
    with tempfile.TemporaryDirectory(prefix="hosts-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        cluster, workload, local_s = calibrated(a, work)
        with EmulatedHosts(4, tag=None) as hosts:
            progress(f"broadcast through SwarmX, every link at {LINK_RATE}")
            for h in hosts:
                hosts.set_rate(h.name, LINK_RATE)
            sent, seconds = broadcast(hosts, a, work, PYTHONPATH)
            for h in hosts:
                hosts.set_rate(h.name, None)
            busiest, link_ratio = busiest_link(sent, seconds, LINK_RATE)
            with SlurmCluster(hosts) as slurm:
                progress("N=2 across hosts, links unlimited")
                cross_s, placement = slurm_step_s(slurm, job2, work, "unlimited", a)
                for h in hosts:
                    hosts.set_rate(h.name, LINK_RATE)
                progress(f"N=2 across hosts, links at {LINK_RATE}")
                cross_1g_s, _ = slurm_step_s(slurm, job2, work, LINK_RATE, a)
    predicted = predicted_across_hosts(cluster, workload, parse_rate(LINK_RATE) / 8)
    measured = {"unlimited": cross_s, LINK_RATE: cross_1g_s}
    errors = relative_errors(predicted, measured)
    result = {
        **figures(link_ratio, cross_s, local_s, errors),
        "config": {k: v for k, v in vars(a).items() if k != "deadline" and not isinstance(v, Path)},
        "model": workload.model,
        "placement": placement,  # role -> the host it ran on, across hosts
        "broadcast": {"link_sent_bytes": sent, "seconds": round(seconds, 3), "busiest": busiest},
        "step_s": {
            "one_host": round(local_s, 4),
            "across_hosts": round(cross_s, 4),
            f"across_hosts_{LINK_RATE}": round(cross_1g_s, 4),
        },
        "predicted_step_s": {k: round(v, 4) for k, v in predicted.items()},
        "simulate_error": {k: round(v, 3) for k, v in errors.items()},
        # how each figure was calibrated on this host, the network plane's (used here) included
        "calibration_notes": list(cluster.over_network().notes),
    }
    print(json.dumps(record("hosts", result)), flush=True)
    return result


if __name__ == "__main__":
    main()

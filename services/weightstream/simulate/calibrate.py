"""Calibration: a ``Cluster`` for this machine from measurements at N = 1 only.

What is measured (``bench/scaling.py`` does it), and what each figure becomes:
  - a worker's forward and backward per unit and sample with 1 .. all cores, timed in a process with the
    thread settings the local backend gives a worker  ->  ``unit_seconds`` (1 core), ``core_speedup``;
  - MemoryX's update (norm + optimizer step) in a one-thread process  ->  ``memoryx_update_rate``;
  - the appliance at N = 1 on the same units with almost no compute (sequence 1, one sample): the CPU
    every role spends per step on moving bytes, over the bytes times links they moved  ->
    ``stream_cpu_s_per_byte``; and its step time, which is then nearly all transport  ->  the bandwidth of
    one hop (bisection: the model's step of that run, with no barrier, equals the measured one);
  - the same with a tiny model of as many units (bytes ~1000x fewer): its step is what transfers cost
    whatever their size (RPCs, the Python around them)  ->  ``link_latency_s``;
  - optionally, the first null run again with every byte on the network plane, on loopback
    (``runconfig.data_plane: grpc``), derived the same way  ->  ``network_stream_cpu_s_per_byte``,
    ``network_link_bandwidth``: what roles on separate hosts pay (``Cluster.over_network``). The latency
    stays the tiny run's: a transfer's fixed cost is its RPCs, which both planes make (shared memory sends
    the header over gRPC too);
  - the appliance at N = 1 on the real job: what the model does not yet explain of its step time  ->
    ``step_overhead_s`` (the coordinator's rounds, and whatever else a step pays once).
Nothing measured at N > 1 goes in: the bench measures N = 2 and 4 only to compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from weightstream.simulate.cluster import Cluster
from weightstream.simulate.model import predict_one, transport_bytes
from weightstream.simulate.workload import Workload

__all__ = ["Measurements", "NullRun", "calibrate", "median_steps", "read_metrics"]

ROLE_KINDS = ("memoryx", "swarmx", "worker", "activation", "coordinator")


@dataclass(frozen=True)
class NullRun:
    """The appliance at N = 1 on the calibrated model's units with (almost) no compute."""

    step_s: float  # median step time
    cpu_s_per_step: dict[str, float]  # CPU-seconds per step by role kind (coordinator included)
    workload: Workload  # the same units; its compute is what the model still charges for it


@dataclass(frozen=True)
class Measurements:
    """Everything a calibration uses, in SI units; all of it at N = 1 or in one process."""

    host_cores: int
    unit_seconds_by_cores: dict[int, list[tuple[float, float]]]  # cores -> (fwd, bwd) s per unit and sample
    update_rate: float  # parameters/s, one thread
    reduce_rate: float  # bytes/s of gradients added up, one thread
    step_s: float  # median step time of the job at N = 1
    null: NullRun
    # the same with a tiny model (same depth, ~1000x fewer bytes): what a transfer costs whatever its
    # size (the RPCs, the Python around them) -> the latency per hop; None: no latency
    tiny: NullRun | None = None
    # ``null`` again with every byte on the network plane (``runconfig.data_plane: grpc``): that plane's
    # cost per byte and its bandwidth per hop; None: not measured (the cluster gets no network figures)
    network_null: NullRun | None = None
    swarmx_fanout: int = 4
    memoryx_shards: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_cores": self.host_cores,
            "unit_seconds_by_cores": {str(k): v for k, v in self.unit_seconds_by_cores.items()},
            "update_rate": self.update_rate,
            "reduce_rate": self.reduce_rate,
            "step_s_n1": self.step_s,
            "null_step_s": self.null.step_s,
            "null_cpu_s_per_step": self.null.cpu_s_per_step,
            "tiny_null_step_s": self.tiny.step_s if self.tiny else None,
            "network_null_step_s": self.network_null.step_s if self.network_null else None,
            "network_null_cpu_s_per_step": self.network_null.cpu_s_per_step if self.network_null else None,
        }


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (one JSON object a line; blank lines skipped)."""
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON record: {e}") from e
    return rows


def median_steps(rows: list[dict[str, Any]], skip: int) -> float:
    """The median ``step_time_s`` of metrics.jsonl records after the first ``skip`` steps (which warm
    caches, allocators and connections up); evaluation records are ignored."""
    times = [r["step_time_s"] for r in rows if "step_time_s" in r and r["step"] > skip]
    if not times:
        raise ValueError(f"no step records after step {skip}: run more steps or skip fewer")
    times.sort()
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def _bisect(f: Any, lo: float, hi: float, target: float, geometric: bool, iters: int = 80) -> float:
    """x in [lo, hi] with f(x) = target for f monotonic in x (either way); the nearer end if the target
    lies outside f's range. ``geometric``: halve the ratio (a rate over decades), else the difference."""
    rising = f(hi) > f(lo)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5 if geometric else (lo + hi) / 2
        if (f(mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5 if geometric else (lo + hi) / 2


def calibrate(m: Measurements, workload: Workload, name: str = "this machine") -> Cluster:
    """The ``Cluster`` of this machine: every role on one host of ``m.host_cores`` cores, exchanging
    tensors in shared memory; with ``m.network_null``, also the network data plane's figures, which
    ``Cluster.over_network`` puts in place for roles on separate hosts."""
    cores = sorted(m.unit_seconds_by_cores)
    if cores != list(range(1, len(cores) + 1)):
        raise ValueError(f"unit timings on {cores} cores: every count from 1 up is needed")
    one = m.unit_seconds_by_cores[1]
    total_one = sum(f + b for f, b in one)
    speedup = tuple(total_one / sum(f + b for f, b in m.unit_seconds_by_cores[k]) for k in cores)
    flops = sum((u.fwd_flops + u.bwd_flops) for u in workload.units)

    def transport_cpu(null: NullRun) -> float:
        """CPU-seconds per byte and link: the CPU of a null run beyond what its (tiny) compute and the
        update take, over the bytes times links it moved."""
        null_flops = sum(u.fwd_flops + u.bwd_flops for u in null.workload.units)
        compute = null_flops * (null.workload.batch(1) or 1) * total_one / flops
        cpu = sum(null.cpu_s_per_step.values()) - compute - workload.num_params / m.update_rate
        return max(0.0, cpu) / transport_bytes(null.workload, 1)[0]

    stream_cpu = transport_cpu(m.null)
    base = Cluster(
        name=name,
        unit_seconds=tuple((f, b) for f, b in one),
        unit_signature=workload.signature,
        core_speedup=speedup,
        worker_flops=flops / total_one,
        swarmx_fanout=m.swarmx_fanout,
        swarmx_reduce_rate=m.reduce_rate,
        memoryx_shards=m.memoryx_shards,
        memoryx_update_rate=m.update_rate,
        host_cores=m.host_cores,
        workers_per_host=0,
        stream_cpu_s_per_byte=stream_cpu,
        notes=(),
    )

    def fitted(bw: float, latency: float, overhead: float = 0.0, cpu: float = stream_cpu) -> Cluster:
        # loopback: a hop is as fast as one core moves the bytes; a SwarmX node serves its children from
        # as many cores as the host has
        return replace(
            base,
            stream_cpu_s_per_byte=cpu,
            link_bandwidth=bw,
            memoryx_bandwidth=bw,
            swarmx_bandwidth=bw * m.host_cores,
            link_latency_s=latency,
            step_overhead_s=overhead,
        )

    # The null runs are charged to the transport entirely (their few milliseconds of coordinator rounds
    # included): the big one gives the bandwidth, the tiny one the latency; each depends only a little on
    # the other's figure, so two rounds settle both. The job's step then gives the barrier. (Fitting the
    # barrier from the null runs too would be ill-posed: they differ from the job by compute only.)
    bw, latency = 1e9, 0.0
    for _ in range(2 if m.tiny else 1):
        bw = _bisect(
            lambda x, lat=latency: _step(fitted(x, lat), m.null.workload), 1e6, 1e12, m.null.step_s, True
        )
        if m.tiny is not None:
            latency = _bisect(
                lambda x, b=bw, w=m.tiny.workload: _step(fitted(b, x), w), 0.0, 1.0, m.tiny.step_s, False
            )
    overhead = max(0.0, m.step_s - _step(fitted(bw, latency), workload))
    cluster = fitted(bw, latency, overhead)
    notes = [
        f"measured: a worker's unit compute on 1..{m.host_cores} cores, speedup "
        + ", ".join(f"{s:.2f}" for s in speedup),
        f"measured: MemoryX updates {m.update_rate:.3g} parameters/s on one core",
        f"measured (N=1, no compute, shared memory): transport {stream_cpu * 1e9:.2f} CPU-ns per byte "
        f"and link, {bw / 1e9:.2f} GB/s and {latency * 1e3:.2f} ms per hop",
        f"measured (N=1): {overhead:.3f} s per step the rest of the model does not explain (barrier)",
        f"every role shares this host's {m.host_cores} cores; N workers get {m.host_cores}//N cores each",
    ]
    if m.network_null is not None:
        # the bandwidth fit again on the run over gRPC, with its own CPU per byte and the latency above
        net_cpu, net = transport_cpu(m.network_null), m.network_null
        net_bw = _bisect(
            lambda x: _step(fitted(x, latency, cpu=net_cpu), net.workload), 1e6, 1e12, net.step_s, True
        )
        cluster = replace(cluster, network_stream_cpu_s_per_byte=net_cpu, network_link_bandwidth=net_bw)
        notes.insert(
            3,
            "measured (N=1, no compute, every byte over the network plane on loopback): "
            f"{net_cpu * 1e9:.2f} CPU-ns per byte and link, {net_bw / 1e9:.2f} GB/s per hop (for roles on "
            "separate hosts: --data-plane network)",
        )
    return replace(cluster, notes=tuple(notes))


def _step(cluster: Cluster, workload: Workload) -> float:
    p = predict_one(cluster, workload, 1)
    assert p is not None
    return p.step_s

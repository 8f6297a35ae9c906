"""A cluster described by a few measured or stated costs, and the presets.

A ``Cluster`` is plain numbers in SI units (seconds, bytes, bytes/s, FLOP/s, parameters/s): what the
cost model needs to price a step of weight streaming. It round-trips through JSON/YAML (``--cluster
FILE``) and is what a calibration (``--calibration FILE``) holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["PRESETS", "Cluster", "ClusterError", "cerebras_like", "load_cluster"]

Relay = Literal["store_and_forward", "cut_through"]


class ClusterError(ValueError):
    """A cluster description that cannot be priced; the message names the field and the value."""


@dataclass(frozen=True)
class Cluster:
    name: str
    # -- a worker's compute: measured per unit, or a FLOP rate -----------------------------------------
    # seconds of (forward, backward) per sample of each unit on ONE core, for the model whose unit
    # shapes ``unit_signature`` names (a calibration); other models fall back to ``worker_flops``
    unit_seconds: tuple[tuple[float, float], ...] = ()
    unit_signature: str = ""
    # a worker's speed on k cores relative to one core (entry k-1); past the last entry it stays flat
    # (more threads than measured are not assumed to help)
    core_speedup: tuple[float, ...] = (1.0,)
    worker_flops: float = 0.0  # FLOP/s one worker sustains on one core's worth of ``core_speedup``
    # -- links: one hop is MemoryX -> SwarmX, SwarmX -> SwarmX or SwarmX -> worker (and back up) -------
    link_bandwidth: float = 12.5e9  # bytes/s of one link, each direction (100 GbE)
    link_latency_s: float = 5e-6  # per hop and transfer: a request, the first byte, the handshake
    # how SwarmX passes a broadcast on: weightstream's forwards each message as it arrives (cut_through);
    # store_and_forward takes the whole unit first. The reduction is store and forward either way.
    relay: Relay = "cut_through"
    # -- SwarmX ------------------------------------------------------------------------------------------
    swarmx_fanout: int = 4
    swarmx_bandwidth: float = 12.5e9  # bytes/s one node sends in all (its children share it) and takes in
    swarmx_reduce_rate: float = 10e9  # bytes/s of gradient one node adds up
    # -- MemoryX -----------------------------------------------------------------------------------------
    memoryx_shards: int = 1
    memoryx_bandwidth: float = 12.5e9  # bytes/s one shard serves weights and takes gradients
    memoryx_update_rate: float = 1e9  # parameters/s one shard updates (gradient norm + optimizer step)
    # -- hosts: what shares the cores ----------------------------------------------------------------------
    host_cores: int = 1  # cores of one worker host
    # workers per host; 0: every worker AND every other role share one host (one machine, as here),
    # and each worker gets host_cores // N threads (at least 1), as the local backend gives them
    workers_per_host: int = 1
    # CPU-seconds a byte costs per hop when the transport runs in software on the shared host (copies,
    # checksums, gRPC): it competes with the workers' compute for the same cores. 0: dedicated hardware
    stream_cpu_s_per_byte: float = 0.0
    # -- the network data plane: what the figures above become when roles on separate hosts exchange
    # tensors on the network instead of shared memory (a calibration measures both, see ``over_network``).
    # None: not measured; the figures above stand for both planes
    network_stream_cpu_s_per_byte: float | None = None  # CPU-seconds a byte costs per hop over gRPC
    network_link_bandwidth: float | None = None  # bytes/s of one hop over gRPC, each direction
    # -- the step barrier ----------------------------------------------------------------------------------
    step_overhead_s: float = 0.0  # per step: the coordinator's RunStep, GradNormSq, ApplyUpdate rounds
    per_worker_overhead_s: float = 0.0  # per step and worker: the coordinator's calls to each
    worker_jitter: float = 0.0  # spread (std / mean) of one worker's step: the barrier waits for the slowest
    notes: tuple[str, ...] = field(default=())  # where each figure came from (measured or assumed)

    def __post_init__(self) -> None:
        positive = (
            "link_bandwidth", "swarmx_bandwidth", "swarmx_reduce_rate", "memoryx_bandwidth",
            "memoryx_update_rate",
        )  # fmt: skip
        for name in positive:
            _check(name, getattr(self, name), lambda v: v > 0, "a number > 0")
        for name in (
            "link_latency_s", "stream_cpu_s_per_byte", "step_overhead_s", "per_worker_overhead_s",
            "worker_jitter", "worker_flops",
        ):  # fmt: skip
            _check(name, getattr(self, name), lambda v: v >= 0, "a number >= 0")
        for name, ok, expected in (
            ("network_stream_cpu_s_per_byte", lambda v: v >= 0, "a number >= 0"),
            ("network_link_bandwidth", lambda v: v > 0, "a number > 0"),
        ):
            if getattr(self, name) is not None:  # None: not measured
                _check(name, getattr(self, name), ok, f"{expected} or null (not measured)")
        _check("swarmx_fanout", self.swarmx_fanout, lambda v: v >= 2, "an integer >= 2")
        for name in ("memoryx_shards", "host_cores"):
            _check(name, getattr(self, name), lambda v: v >= 1, "an integer >= 1")
        _check("workers_per_host", self.workers_per_host, lambda v: v >= 0, "an integer >= 0")
        if self.relay not in ("store_and_forward", "cut_through"):
            raise ClusterError(f"relay: {self.relay!r}, expected store_and_forward or cut_through")
        if not self.core_speedup or any(not (math.isfinite(s) and s > 0) for s in self.core_speedup):
            raise ClusterError(f"core_speedup: {self.core_speedup!r}, expected a list of numbers > 0")
        for i, pair in enumerate(self.unit_seconds):
            if len(pair) != 2 or any(not (math.isfinite(s) and s >= 0) for s in pair):
                raise ClusterError(f"unit_seconds[{i}]: {pair!r}, expected [forward_s, backward_s] >= 0")
        if not self.unit_seconds and self.worker_flops <= 0:
            raise ClusterError("worker_flops: 0 and no unit_seconds: give a FLOP rate or a calibration")

    @property
    def shared_host(self) -> bool:
        """Every role on one host (this development machine): the workers split its cores."""
        return self.workers_per_host == 0

    @property
    def has_network_figures(self) -> bool:
        """Whether a calibration measured the network data plane (``over_network`` then changes something)."""
        return self.network_stream_cpu_s_per_byte is not None or self.network_link_bandwidth is not None

    def over_network(self) -> Cluster:
        """This cluster with its roles exchanging tensors over the network data plane (gRPC byte streams):
        the network figures in place of ``stream_cpu_s_per_byte`` and ``link_bandwidth``. A MemoryX shard
        and a SwarmX node keep their bandwidth in the same proportion to one link's (a calibration's
        SwarmX node serves its children from every core of the host: ``host_cores`` links' worth). The
        network figures are cleared in the result, whose own figures are now the network's: calling it
        again, or on a cluster without network figures, returns the cluster unchanged."""
        if not self.has_network_figures:
            return self
        cpu = self.network_stream_cpu_s_per_byte
        cpu = self.stream_cpu_s_per_byte if cpu is None else cpu
        bw = self.network_link_bandwidth or self.link_bandwidth
        scale = bw / self.link_bandwidth
        note = (
            "predicted over the network data plane (roles on separate hosts): "
            f"transport {cpu * 1e9:.2f} CPU-ns per byte and link, {bw / 1e9:.2f} GB/s per hop"
        )
        return replace(
            self,
            stream_cpu_s_per_byte=cpu,
            link_bandwidth=bw,
            memoryx_bandwidth=self.memoryx_bandwidth * scale,
            swarmx_bandwidth=self.swarmx_bandwidth * scale,
            network_stream_cpu_s_per_byte=None,
            network_link_bandwidth=None,
            notes=(*self.notes, note),
        )

    def speedup(self, cores: int) -> float:
        return self.core_speedup[min(cores, len(self.core_speedup)) - 1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any], where: str = "cluster") -> Cluster:
        known = {f.name for f in fields(Cluster)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ClusterError(
                f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        d = dict(d)
        for key in ("core_speedup", "notes"):
            if key in d:
                d[key] = tuple(d[key])
        if "unit_seconds" in d:
            d["unit_seconds"] = tuple(tuple(p) for p in d["unit_seconds"])
        try:
            return Cluster(**d)
        except TypeError as e:
            raise ClusterError(f"{where}: {e}") from e


def _check(name: str, value: Any, ok: Any, expected: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not ok(value)
    ):
        raise ClusterError(f"{name}: {value!r}, expected {expected}")


def load_cluster(path: Path) -> Cluster:
    """A cluster from a JSON or YAML file: a mapping of ``Cluster`` fields, or a calibration file (whose
    ``cluster`` key holds them)."""
    try:
        text = path.read_text(encoding="utf-8")
        try:  # JSON first: YAML 1.1 reads JSON's 1e-09 (no dot) as a string, not a number
            data = json.loads(text)
        except json.JSONDecodeError:
            data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise ClusterError(f"{path}: cannot be read: {e}") from e
    if isinstance(data, dict) and isinstance(data.get("cluster"), dict):
        data = data["cluster"]
    if not isinstance(data, dict):
        raise ClusterError(f"{path}: expected a mapping of cluster fields, got {type(data).__name__}")
    return Cluster.from_dict(data, str(path))


# -- presets ------------------------------------------------------------------------------------------------
# Assumed, not measured: public figures of a Cerebras Wafer-Scale Cluster, rounded. A CS-2 is ~7,000 times
# this 2-core machine's ~0.14 TFLOP/s; its links are 100 GbE-class; MemoryX and SwarmX are separate servers.
CEREBRAS_NOTES = (
    "assumed: a CS-2 worker sustains 1 PFLOP/s on GPT-style units (~7,000x this 2-core machine)",
    "assumed: every hop is 12 x 100 GbE = 150 GB/s each way, 10 us per hop and transfer",
    "assumed: a SwarmX node moves 150 GB/s in all and adds gradients at 150 GB/s",
    "assumed: 12 MemoryX shards, each serving 150 GB/s and updating 2e9 parameters/s",
    "assumed: one worker per host (a CS-2 has its own compute); no transport CPU shared with compute",
    "assumed: 20 ms of coordinator rounds per step, 0.2 ms per worker, 2% jitter per worker",
)


def cerebras_like() -> Cluster:
    """Workers far faster than their links: where weight streaming, not compute, sets the pace."""
    return Cluster(
        name="cerebras-like",
        worker_flops=1e15,
        link_bandwidth=150e9,
        link_latency_s=10e-6,
        swarmx_fanout=4,
        swarmx_bandwidth=150e9,
        swarmx_reduce_rate=150e9,
        memoryx_shards=12,
        memoryx_bandwidth=150e9,
        memoryx_update_rate=2e9,
        host_cores=1,
        workers_per_host=1,
        step_overhead_s=0.02,
        per_worker_overhead_s=2e-4,
        worker_jitter=0.02,
        notes=CEREBRAS_NOTES,
    )


PRESETS = {"cerebras-like": cerebras_like}

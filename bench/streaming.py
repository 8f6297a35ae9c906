"""Weight-streaming overhead and bandwidth, each against a baseline measured in the same run.

Prints one JSON line:
- step time of the in-process numpy reference vs `weightstream run --num_csx 1` on the same params
  (the streaming overhead ratio; target <= 1.05), and tokens/s at num_csx 1 and 2. The two are measured
  interleaved, every appliance run between two reference runs (reference, appliance, reference, ...,
  ``--pairs`` appliance runs): a shared machine drifts by several percent within minutes, which a
  reference measured only before the appliance reads as overhead. Each pair's ratio is the appliance run
  over the mean of the reference runs either side of it; the ratio is the median of the pairs' ratios,
  with the interval its pairs put that median in (order statistics, ~96% at 9 pairs): on a 2-core
  machine shared with other work, single pairs spread by +-5%, so one run's ratio is an estimate, not a
  measurement to three digits. Every run's step time and each pair's ratio are reported too, as are the
  medians of each side's;
- bandwidth of a unit broadcast through MemoryX -> SwarmX -> client and of MemoryX alone, on the
  shared-memory plane co-located roles use and over gRPC (as across hosts), vs a raw gRPC server stream of
  4 MiB messages over loopback.

    python bench/streaming.py [--hidden 512 --layers 4 --seq 256 --batch 8 --steps 10 --pairs 9]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import math
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import numpy as np
import yaml
from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.backends.base import RoleSpec
from weightstream.backends.local import LocalProcessBackend
from weightstream.numerics._gemm import engine
from weightstream.params import load_params, model_def
from weightstream.plan import JobSpec, make_plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.training.reference import ReferenceTrainer
from weightstream.transport import bulk
from weightstream.transport.auth import new_role_token
from weightstream.transport.bulk import host_of_address
from weightstream.transport.plane import NETWORK, SHARED_MEMORY, NetworkPlane, SharedMemoryPlane
from weightstream.transport.rpc import OPTIONS, open_channel, tensors_out_client
from weightstream.transport.shm import job_tag


def params_dict(a: argparse.Namespace, hidden: int, layers: int, steps: int) -> dict[str, Any]:
    return {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": a.batch,
            "max_sequence_length": a.seq,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_heads": hidden // 64,
            "max_position_embeddings": a.seq,
        },
        "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-4, "max_gradient_norm": 1.0},
        "runconfig": {"max_steps": steps, "log_steps": 1, "num_wgt_servers": 1, "seed": 1},
    }


def reference_step_s(raw: dict[str, Any], steps: int) -> float:
    trainer = ReferenceTrainer(load_params(raw), num_shards=1)
    times = [trainer.train_step().step_time_s for _ in range(steps)]
    return statistics.median(times[1:])


class ApplianceRun(NamedTuple):
    step_s: float  # median step time after the first step
    tokens_per_second: float  # from that median
    # the run's medians of the worker's compute and of its wait for weights (metrics.jsonl): when a run
    # reads slow, whether the worker computed slower (the machine) or waited (the roles)
    worker_compute_s: float
    worker_wait_s: float


def appliance_step_s(raw: dict[str, Any], num_csx: int, workdir: Path) -> ApplianceRun:
    """Step time and its parts of a fresh `weightstream run`, after its first step."""
    path = workdir / f"params{num_csx}.yaml"
    path.write_text(yaml.safe_dump(raw))
    # A new directory for every run: in one it has used before, `weightstream run` resumes from the
    # finished run's checkpoint, trains nothing and leaves that run's metrics.jsonl to be read again
    model_dir = Path(tempfile.mkdtemp(prefix=f"run{num_csx}_", dir=workdir))
    cmd = [
        sys.executable,
        "-m",
        "weightstream.cli",
        "run",
        str(path),
        "--num_csx",
        str(num_csx),
        "--model_dir",
        str(model_dir),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1200)
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_time_s" in r][1:]
    step_s = statistics.median(r["step_time_s"] for r in steps)
    tokens = raw["train_input"]["batch_size"] * raw["train_input"]["max_sequence_length"]
    return ApplianceRun(
        step_s,
        tokens / step_s,
        statistics.median(r["worker_compute_s"] for r in steps),
        statistics.median(r["worker_wait_s"] for r in steps),
    )


def overhead(refs: list[float], ones: list[float]) -> tuple[float, list[float]]:
    """(median of the pairs' ratios, each pair's ratio). ``ones[i]`` ran between ``refs[i]`` and
    ``refs[i + 1]`` and is compared with their mean: a machine whose speed moves steadily across the
    pair moves both sides alike, where a reference measured only before would read the move as overhead
    (or as a gain). Each ratio is from runs a minute apart, never from medians of runs that the
    machine's drift may have put far apart."""
    if len(refs) != len(ones) + 1:
        raise ValueError(f"{len(ones)} appliance runs need {len(ones) + 1} reference runs around them")
    pairs = [o / ((before + after) / 2) for o, before, after in zip(ones, refs[:-1], refs[1:], strict=True)]
    return statistics.median(pairs), pairs


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the distribution-free interval for the median of what ``xs`` sample, from
    their order statistics. The k-th smallest and k-th largest of n values bound the median with
    probability 1 - 2 P(Binomial(n, 1/2) < k); k is the largest whose coverage reaches ``level`` (k = 1, the
    extremes, when none does: their coverage, 1 - 2^(1-n), is then below ``level`` and says so). It assumes
    only that the pairs are independent draws, not how the machine's noise is distributed."""
    n = len(xs)
    if n < 2:
        raise ValueError(f"an interval needs at least 2 values, got {n}")
    s = sorted(xs)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = max((k for k in range(1, n // 2 + 1) if coverage(k) >= level), default=1)
    return s[k - 1], s[n - k], coverage(k)


def interval_field(pairs: list[float]) -> dict[str, float] | None:
    """The JSON's ``streaming_overhead_interval``: None for a single pair (``--pairs 1``), which bounds
    nothing, rather than failing a finished bench run at its last line."""
    if len(pairs) < 2:
        return None
    low, high, cover = median_interval(pairs)
    return {"low": round(low, 3), "high": round(high, 3), "coverage": round(cover, 3)}


# -- raw gRPC baseline: a server streams prebuilt 4 MiB messages, a client copies them into a buffer
def _raw_server(port_q: Any, total: int) -> None:
    chunk = bytes(4 << 20)

    def stream(request: bytes, context: grpc.ServicerContext) -> Any:
        for _ in range(total // len(chunk)):
            yield chunk

    handler = grpc.method_handlers_generic_handler(
        "bench.Raw", {"Stream": grpc.unary_stream_rpc_method_handler(stream, lambda b: b, lambda b: b)}
    )
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(4), options=OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def raw_grpc_gbps(total: int, repeats: int) -> float:
    q: Any = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_raw_server, args=(q, total), daemon=True)
    proc.start()
    port = q.get(timeout=60)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
    call = channel.unary_stream(
        "/bench.Raw/Stream", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    buf = np.empty(total, dtype=np.uint8)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        off = 0
        for msg in call(b""):
            buf[off : off + len(msg)] = np.frombuffer(msg, dtype=np.uint8)
            off += len(msg)
        best = min(best, time.perf_counter() - t0)
    proc.kill()
    return total / best / 1e9


def broadcast_gbps(
    a: argparse.Namespace, workdir: Path, repeats: int, shared_memory: bool
) -> dict[str, float]:
    """A MemoryX shard and a SwarmX node as real processes; one GPT-2 block fetched through each, read as a
    worker reads it (checksums checked), on the shared-memory plane or over gRPC."""
    raw = params_dict(a, a.bw_hidden, 1, 1)
    params = load_params(raw)
    plan = make_plan(params)
    backend = LocalProcessBackend(workdir / f"bw{int(shared_memory)}")
    token = new_role_token()
    backend.start([RoleSpec("memoryx", 0), RoleSpec("swarmx", 0)], token)
    try:
        addrs = backend.wait_ready(60)
        addrs.update(worker=[], activation=[])
        for kind in ("memoryx", "swarmx"):
            job = JobSpec(
                params.model_dump(mode="json"), plan.to_dict(), addrs, kind, 0, shared_memory=shared_memory
            )
            rpc.ControlStub(open_channel(addrs[kind][0], token)).Configure(
                pb.ConfigureRequest(job_json=job.to_json())
            )
        tag = job_tag(token) if shared_memory else None
        plane = SHARED_MEMORY if shared_memory else NETWORK  # as a worker on this host says it reads
        model = model_def(params)
        names = list(model.units[1].param_names)
        nbytes = model.unit_bytes(1)
        mx = tensors_out_client(
            open_channel(addrs["memoryx"][0], token, plane=plane), "MemoryX", "GetTensors", pb.TensorRequest
        )
        sx = tensors_out_client(
            open_channel(addrs["swarmx"][0], token, plane=plane), "SwarmX", "GetUnit", pb.UnitRequest
        )
        # read as a worker reads: on its plane, with a bulk endpoint of its own for the network plane's
        reader = SharedMemoryPlane(tag) if tag is not None else NetworkPlane()
        bulk.start("127.0.0.1", token)
        t_mx, t_sx = [], []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            reader.read(mx(pb.TensorRequest(step=0, names=names)), peer=host_of_address(addrs["memoryx"][0]))
            t_mx.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            unit = sx(pb.UnitRequest(step=0, unit=1, phase=100 + i))  # a new phase: a cache miss
            reader.read(unit, peer=host_of_address(addrs["swarmx"][0]))
            t_sx.append(time.perf_counter() - t0)
        return {
            "unit_bytes": nbytes,
            "memoryx_gbps": nbytes / min(t_mx[1:]) / 1e9,
            "memoryx_swarmx_gbps": nbytes / min(t_sx[1:]) / 1e9,
        }
    finally:
        bulk.stop()
        backend.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    # 10 steps a run and 9 pairs: ~5.5 min here (6 and 5 before: ~3 min, and no interval reaching 95%)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=9, help="num_csx 1 runs, each between two reference runs")
    ap.add_argument("--bw-hidden", type=int, default=1024, help="hidden size of the block used for bandwidth")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    # the first step of a run and the first read of a unit are not timed: one more of each must be
    for flag, value, least in (("pairs", a.pairs, 1), ("steps", a.steps, 2), ("repeats", a.repeats, 1)):
        if value < least:
            ap.error(f"--{flag} must be >= {least}, got {value}")
    raw = params_dict(a, a.hidden, a.layers, a.steps)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        refs, runs = [reference_step_s(raw, a.steps)], []
        for _ in range(a.pairs):  # reference, appliance, reference, ...: every appliance run bracketed
            runs.append(appliance_step_s(raw, 1, work))
            refs.append(reference_step_s(raw, a.steps))
        ones = [r.step_s for r in runs]
        ref, one = statistics.median(refs), statistics.median(ones)
        ratio, pairs = overhead(refs, ones)
        tps2 = appliance_step_s(raw, 2, work).tokens_per_second
        bw = broadcast_gbps(a, work, a.repeats, shared_memory=True)
        bw_grpc = broadcast_gbps(a, work, a.repeats, shared_memory=False)
        raw_gbps = raw_grpc_gbps(int(bw["unit_bytes"]) // (4 << 20) * (4 << 20) or (4 << 20), a.repeats)
    print(
        json.dumps(
            record(
                "streaming",
                {
                    "config": vars(a),
                    "gemm_engine": engine(),  # the products' engine, both sides' (numerics/_gemm.py)
                    "reference_step_s": round(ref, 4),  # medians over the runs
                    "appliance_step_s_num_csx_1": round(one, 4),
                    "streaming_overhead_ratio": round(ratio, 3),
                    # appliance / mean of the reference runs before and after it, in order
                    "streaming_overhead_pairs": [round(x, 3) for x in pairs],
                    # where the pairs put the overhead's median: how far one run's ratio can be trusted
                    "streaming_overhead_interval": interval_field(pairs),
                    # every run's median step time, in order: how far the machine moved during the bench
                    "reference_runs_step_s": [round(x, 4) for x in refs],
                    "appliance_runs_step_s": [round(x, 4) for x in ones],
                    "appliance_runs_worker_compute_s": [round(r.worker_compute_s, 4) for r in runs],
                    "appliance_runs_worker_wait_s": [round(r.worker_wait_s, 4) for r in runs],
                    "tokens_per_second": {
                        "reference": round(raw["train_input"]["batch_size"] * a.seq / ref),
                        "num_csx_1": round(raw["train_input"]["batch_size"] * a.seq / one),
                        "num_csx_2": round(tps2),
                    },
                    # co-located roles (what `weightstream run` uses here): the shared-memory plane; the
                    # *_grpc figures: the byte stream roles on different hosts use
                    "bandwidth_gbps": {
                        "raw_grpc_loopback": round(raw_gbps, 3),
                        "memoryx": round(bw["memoryx_gbps"], 3),
                        "memoryx_via_swarmx": round(bw["memoryx_swarmx_gbps"], 3),
                        "memoryx_grpc": round(bw_grpc["memoryx_gbps"], 3),
                        "memoryx_via_swarmx_grpc": round(bw_grpc["memoryx_swarmx_gbps"], 3),
                    },
                    "bandwidth_ratio_memoryx_over_raw": round(bw["memoryx_gbps"] / raw_gbps, 3),
                    "bandwidth_ratio_swarmx_over_raw": round(bw["memoryx_swarmx_gbps"] / raw_gbps, 3),
                    "bandwidth_ratio_memoryx_grpc_over_raw": round(bw_grpc["memoryx_gbps"] / raw_gbps, 3),
                    "bandwidth_ratio_swarmx_grpc_over_raw": round(
                        bw_grpc["memoryx_swarmx_gbps"] / raw_gbps, 3
                    ),
                },
            )
        )
    )


if __name__ == "__main__":
    main()

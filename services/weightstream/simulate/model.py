"""The cost model: one training step of weight streaming at N workers, priced term by term.

A step as ``training/runner.py`` and ``worker/engine.py`` run it:
  1. the coordinator calls RunStep on every worker (the barrier starts the step);
  2. each worker streams units in for forward, one at a time, fetching unit u+1 while it computes u;
     each fetch is a broadcast down the SwarmX tree: pull, single flight, and (``cut_through``, as
     ``swarmx/node.py`` does) a node passes each message on as it arrives (``store_and_forward``: it
     takes the whole unit before it serves its children);
  3. backward in reverse: the last unit's weights are kept from forward, every other unit streams in
     again (not in ``pipelined`` mode), and each unit's gradient is pushed up while the next computes,
     at most one push in flight: a push returns once the whole reduction path has taken the sum;
  4. the coordinator waits for every worker (the slowest: jitter), then every MemoryX shard sums its
     squared gradients and applies the optimizer: no weights of the next step leave MemoryX before.
So per unit the pipeline runs at the slower of its compute and its broadcast (or reduction); the fill
(the first unit's broadcast), the turn to backward (one broadcast not hidden), the drain (the last
reduction), the update and the coordinator's rounds are paid in full every step.

On a shared host (``Cluster.workers_per_host == 0``: all N workers and every other role on one machine)
the cores are the limit too: the step's phase of streaming cannot be shorter than the CPU it needs (the
workers' threads, and the transport's copies and checksums) divided by the cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist

from weightstream.simulate.cluster import Cluster
from weightstream.simulate.workload import Workload

__all__ = ["TERMS", "Prediction", "hop_times", "predict", "predict_one", "transport_bytes", "unit_compute"]

# What a step's time is made of; ``Prediction.limit`` is the largest.
TERMS = ("compute", "broadcast", "reduce", "cores", "update", "barrier")
CHUNK_BYTES = 4 << 20  # a cut-through relay forwards each 4 MiB message as it arrives (transport.tensors)


@dataclass(frozen=True)
class Prediction:
    n: int
    samples_per_worker: int
    tree_depth: int  # SwarmX levels between MemoryX and the workers
    step_s: float
    tokens_per_s: float
    efficiency: float  # tokens/s at N over N x tokens/s at 1 (same per-worker batch rule)
    limit: str  # the largest of ``terms``
    terms: dict[str, float]  # seconds of the step spent on each of TERMS; they add up to step_s


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals]: how far the slowest of n workers lags the mean, in standard
    deviations (0 for one). The integral of x d(Phi(x)^n), by the trapezoid rule on [-8, 8]."""
    if n <= 1:
        return 0.0
    nd, h = NormalDist(), 0.01
    xs = [-8.0 + i * h for i in range(1601)]
    ys = [x * n * nd.pdf(x) * nd.cdf(x) ** (n - 1) for x in xs]
    return h * (sum(ys) - (ys[0] + ys[-1]) / 2)


def worker_cores(cluster: Cluster, n: int) -> int:
    """Cores (threads) each worker computes with: its host's share, as the backends hand them out."""
    per_host = n if cluster.shared_host else cluster.workers_per_host
    return max(1, cluster.host_cores // max(1, per_host))


def unit_compute(cluster: Cluster, workload: Workload, samples: int, cores: int) -> list[tuple[float, float]]:
    """(forward, backward) seconds of each unit for one worker's ``samples`` on ``cores`` cores."""
    speed = cluster.speedup(cores)
    if cluster.unit_seconds and cluster.unit_signature == workload.signature:
        return [(f * samples / speed, b * samples / speed) for f, b in cluster.unit_seconds]
    rate = cluster.worker_flops * speed
    return [(u.fwd_flops * samples / rate, u.bwd_flops * samples / rate) for u in workload.units]


def hop_times(cluster: Cluster, nbytes: float, fans: tuple[int, ...], up: bool) -> list[float]:
    """Seconds of each hop for a unit of ``nbytes`` between MemoryX and a worker, top first.

    Down (a broadcast), hop 0 is MemoryX -> root, then each SwarmX level -> the one below (the last to
    the worker); a node serving f children sends f copies through its ``swarmx_bandwidth``. Up (a
    reduction) the same hops: a node takes f gradients in through its bandwidth and adds them up."""
    link = cluster.link_latency_s
    top = link + nbytes / min(cluster.link_bandwidth, cluster.memoryx_bandwidth)
    hops = [top]
    for f in reversed(fans):  # root level first
        move = nbytes * max(1.0 / cluster.link_bandwidth, f / cluster.swarmx_bandwidth)
        add = nbytes * f / cluster.swarmx_reduce_rate if up and f > 1 else 0.0
        hops.append(link + move + add)
    return hops


def _path(cluster: Cluster, hops: list[float], nbytes: float) -> float:
    """A unit's time end to end over ``hops``: each hop in full after the other (store and forward), or,
    cut through, the slowest hop plus one message's time at each other hop."""
    if cluster.relay == "store_and_forward" or len(hops) == 1:
        return sum(hops)
    frac = min(1.0, CHUNK_BYTES / nbytes) if nbytes else 0.0
    return max(hops) + frac * (sum(hops) - max(hops))


@dataclass
class _Timeline:
    compute: float = 0.0
    wait_weights: float = 0.0
    wait_grads: float = 0.0


def _worker_step(
    comp: list[tuple[float, float]], bcast: list[float], reduce: list[float], pipelined: bool
) -> _Timeline:
    """One worker's RunStep, event by event, as ``WorkerEngine.run_step`` orders it."""
    tl = _Timeline()
    n = len(comp)
    t = 0.0

    def stream(order: list[int]) -> Iterator[int]:  # ``WorkerEngine._stream``: prefetch one unit ahead
        nonlocal t
        arrive = t + bcast[order[0]]
        for i, u in enumerate(order):
            tl.wait_weights += max(0.0, arrive - t)
            t = max(t, arrive)
            if i + 1 < len(order):
                arrive = t + bcast[order[i + 1]]
            yield u

    for u in stream(list(range(n))):
        tl.compute += comp[u][0]
        t += comp[u][0]
    # backward: the last unit's weights are still here; the rest stream in again (a generator started
    # only after that unit's backward, so the first of them is fetched with nothing to hide it behind)
    order = list(reversed(range(n)))
    push_done: float | None = None

    def backward(u: int) -> None:
        nonlocal t, push_done
        tl.compute += comp[u][1]
        t += comp[u][1]
        if push_done is not None:  # back-pressure: one push in flight
            tl.wait_grads += max(0.0, push_done - t)
            t = max(t, push_done)
        push_done = t + reduce[u]

    backward(order[0])
    rest = order[1:]
    if pipelined:
        for u in rest:
            backward(u)
    elif rest:
        for u in stream(rest):
            backward(u)
    assert push_done is not None
    tl.wait_grads += max(0.0, push_done - t)  # the drain: the last gradient reaches MemoryX
    return tl


def transport_bytes(workload: Workload, n: int) -> tuple[float, float]:
    """(bytes x links, bytes added up) of one step at ``n`` workers. Every unit crosses each of the
    tree's N + nodes links (MemoryX -> root included) once per pass (backward keeps the last unit, and
    pipelined mode every unit, from forward); every gradient crosses them once back up; and the nodes add
    up N + nodes - 1 gradients in all (a node with one child adds nothing, but then N = 1)."""
    links = n + workload.trees[n].nodes
    passes = [1 if workload.pipelined else 2] * len(workload.units)
    passes[-1] = 1
    down = sum(p * u.wire_bytes for p, u in zip(passes, workload.units, strict=True))
    up = sum(u.grad_bytes for u in workload.units)
    return (down + up) * links, (up * (links - 1) if n > 1 else 0.0)


def _transport_cpu(cluster: Cluster, workload: Workload, n: int) -> float:
    """CPU-seconds per step that moving and adding up bytes costs on a shared host."""
    moved, summed = transport_bytes(workload, n)
    return moved * cluster.stream_cpu_s_per_byte + summed / cluster.swarmx_reduce_rate


def predict_one(cluster: Cluster, workload: Workload, n: int) -> Prediction | None:
    """The step at ``n`` workers (None when the held global batch does not split into ``n``).
    ``efficiency`` is left at 0 here: ``predict`` fills it in against N = 1."""
    samples = workload.batch(n)
    if samples is None or samples < 1:
        return None
    tree = workload.trees[n]
    cores = worker_cores(cluster, n)
    comp = unit_compute(cluster, workload, samples, cores)
    bcast = [
        _path(cluster, hop_times(cluster, u.wire_bytes, tree.fans, False), u.wire_bytes)
        for u in workload.units
    ]
    # a node sums its children's whole gradients before it pushes the sum on: store and forward
    reduce = [sum(hop_times(cluster, u.grad_bytes, tree.fans, True)) for u in workload.units]
    tl = _worker_step(comp, bcast, reduce, workload.pipelined)
    worker_s = tl.compute + tl.wait_weights + tl.wait_grads
    cores_s = 0.0
    if cluster.shared_host:
        # every worker keeps its threads busy while it computes (BLAS threads spin between kernels, so
        # a worker given k cores holds k); the transport's CPU comes on top, all on host_cores cores
        demand = n * cores * tl.compute + _transport_cpu(cluster, workload, n)
        cores_s = max(0.0, demand / cluster.host_cores - worker_s)
    rate = cluster.memoryx_update_rate
    update_s = max(workload.shard_params) / rate
    if cluster.shared_host:  # the shards share the host's cores too
        update_s = max(update_s, sum(workload.shard_params) / (rate * cluster.host_cores))
    straggler = cluster.worker_jitter * expected_max_normal(n) * worker_s
    barrier = cluster.step_overhead_s + n * cluster.per_worker_overhead_s + straggler
    terms = {
        "compute": tl.compute,
        "broadcast": tl.wait_weights,
        "reduce": tl.wait_grads,
        "cores": cores_s,
        "update": update_s,
        "barrier": barrier,
    }
    step = sum(terms.values())
    tokens = n * samples * workload.tokens_per_sample
    return Prediction(
        n=n,
        samples_per_worker=samples,
        tree_depth=tree.depth,
        step_s=step,
        tokens_per_s=tokens / step,
        efficiency=0.0,
        limit=max(TERMS, key=lambda k: terms[k]),
        terms=terms,
    )


def predict(cluster: Cluster, workload: Workload, ns: list[int]) -> list[Prediction | None]:
    """``predict_one`` for every N of ``ns`` (in that order), with the scaling efficiency against the
    prediction at N = 1: tokens/s at N over N x tokens/s at 1."""
    one = predict_one(cluster, workload, 1)
    out: list[Prediction | None] = []
    for n in ns:
        p = predict_one(cluster, workload, n)
        if p is not None and one is not None:
            p = Prediction(**{**p.__dict__, "efficiency": p.tokens_per_s / (n * one.tokens_per_s)})
        out.append(p)
    return out

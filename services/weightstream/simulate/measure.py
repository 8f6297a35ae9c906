"""Timing this machine in-process: a worker's compute per unit and sample, and MemoryX's update rate.

These run the very numerics the roles run (``numerics``), in the calling process, with whatever thread
settings its environment has: to time a worker with k cores, run them in a process started with the
environment the backends give such a worker (``bench/scaling.py`` does). No roles, no gRPC.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from weightstream.data import make_data_processor
from weightstream.numerics import init_params
from weightstream.numerics.layers import cross_entropy_backward, cross_entropy_forward
from weightstream.numerics.optim import grad_sq_sum, init_state, optimizer_step
from weightstream.params import Params, model_def, optimizer_config

__all__ = ["time_reduce", "time_units", "time_update"]


def time_units(params: Params, samples: int, repeats: int = 5) -> list[tuple[float, float]]:
    """(forward, backward) seconds per sample of every unit, at a batch of ``samples``: the fastest of
    ``repeats`` timed passes after one untimed one (first touches of memory, BLAS warm-up). The fastest,
    not the median: on a shared machine other processes only ever add time, so the minimum is the
    closest to what the unit costs.

    The head's times include the loss (its forward and gradient), as the worker computes them there."""
    model = model_def(params)
    x, y = make_data_processor(params.train_input, params.model, "train").shard(0, 0, 1)
    reps = -(-samples // len(x))  # the data processor gives one global batch; repeat it if needed
    x, y = np.concatenate([x] * reps)[:samples], np.concatenate([y] * reps)[:samples]
    weights = [init_params(model, 1, u.param_names) for u in model.units]
    runs: list[list[tuple[float, float]]] = []
    for _ in range(repeats + 1):
        times = [[0.0, 0.0] for _ in model.units]
        saved: list[Any] = []
        h = x
        for i, unit in enumerate(model.units):
            t0 = time.perf_counter()
            h, s = unit.forward(weights[i], h)
            times[i][0] = time.perf_counter() - t0
            saved.append(s)
        t0 = time.perf_counter()
        _, ce = cross_entropy_forward(h, y, y.size)
        dy: np.ndarray | None = cross_entropy_backward(ce, h.shape)
        times[-1][0] += time.perf_counter() - t0
        for i in reversed(range(len(model.units))):
            assert dy is not None
            t0 = time.perf_counter()
            dy, _ = model.units[i].backward(weights[i], saved[i], dy)
            times[i][1] = time.perf_counter() - t0
        runs.append([(f, b) for f, b in times])
    best = min(runs[1:], key=lambda r: sum(f + b for f, b in r))  # one whole pass: units stay consistent
    return [(f / samples, b / samples) for f, b in best]


def time_update(params: Params, repeats: int = 3, max_params: int = 20_000_000) -> float:
    """Parameters per second one MemoryX shard updates in this process: the sum of squares of each
    gradient (the norm for clipping) and the optimizer step, as ``MemoryXShard`` runs them. At most
    ``max_params`` of the model's parameters are timed (the rate is per parameter; elementwise work)."""
    model = model_def(params)
    opt = optimizer_config(params.optimizer)
    names: list[str] = []
    total = 0
    for name, spec in model.specs.items():
        if total + spec.numel > max_params and names:
            break
        names.append(name)
        total += spec.numel
    rng = np.random.default_rng(0)
    weights = {n: rng.standard_normal(model.specs[n].shape, dtype=np.float32) for n in names}
    grads = {n: w * np.float32(1e-3) for n, w in weights.items()}
    state = {n: init_state(opt.kind, model.specs[n].shape) for n in names}
    times = []
    for step in range(1, repeats + 2):
        t0 = time.perf_counter()
        sum(grad_sq_sum(g) for g in grads.values())
        for n in names:
            optimizer_step(opt, weights[n], grads[n], state[n], step=step, lr=1e-4)
        times.append(time.perf_counter() - t0)
    return total / min(times[1:])


def time_reduce(nbytes: int = 64 << 20, children: int = 4, repeats: int = 3) -> float:
    """Bytes/s of gradient a SwarmX node adds up in this process: a copy of the first child's array, then
    one in-place add per other child (``swarmx.node.sum_in_order``), per byte of all children's input."""
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(nbytes // 4, dtype=np.float32) for _ in range(children)]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        total = parts[0].astype(np.float32, copy=True)
        for p in parts[1:]:
            total += p
        times.append(time.perf_counter() - t0)
    return children * nbytes / min(times[1:])

"""Checks every model family shares (GPT-2, LLaMA, dropout): gradients against finite differences, shards
summing to the full batch, and a digest of one step for the bitwise-determinism tests. No torch or pytest
here: the digests also run in bare subprocesses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
from numpy.testing import assert_allclose

from weightstream.numerics import ModelDef, forward_backward, forward_loss


def assert_grads_match_finite_differences(
    model: ModelDef,
    params: dict[str, np.ndarray],
    ids: np.ndarray,
    targets: np.ndarray,
    rng: np.random.Generator,
    atol: float,
    entries: int = 3,
    eps: float = 1e-6,
) -> None:
    """``entries`` random entries of every float64 tensor of ``params``: the analytic gradient equals
    (loss(p + eps) - loss(p - eps)) / (2 eps). Runs in the caller's context (a dropout scope applies)."""
    _, grads = forward_backward(model, params, ids, targets, targets.size)
    for name, p in params.items():
        for flat in rng.choice(p.size, size=min(entries, p.size), replace=False):
            idx = np.unravel_index(flat, p.shape)
            old = p[idx]
            p[idx] = old + eps
            up = forward_loss(model, params, ids, targets, targets.size)
            p[idx] = old - eps
            down = forward_loss(model, params, ids, targets, targets.size)
            p[idx] = old
            assert_allclose(grads[name][idx], (up - down) / (2 * eps), rtol=1e-5, atol=atol, err_msg=name)


def assert_shards_sum_to_global(
    model: ModelDef, params: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray
) -> None:
    """What makes data parallelism exact: uneven shards of the batch (1, 2 and 1 of 4 samples), each with
    the global denominator, add up to the full batch's loss and gradients."""
    loss, grads = forward_backward(model, params, ids, targets, targets.size)
    total = 0.0
    summed = {n: np.zeros_like(v) for n, v in params.items()}
    for s in (slice(0, 1), slice(1, 3), slice(3, 4)):
        part_loss, part = forward_backward(model, params, ids[s], targets[s], targets.size)
        total += part_loss
        for n, g in part.items():
            summed[n] += g
    assert_allclose(total, loss, rtol=1e-12)
    for n in params:
        assert_allclose(summed[n], grads[n], rtol=1e-9, atol=1e-14, err_msg=n)


def step_digest(model: ModelDef, params: dict[str, np.ndarray], ids: np.ndarray) -> str:
    """sha256 over the loss and every gradient of one forward+backward of ``ids`` [B, T+1]."""
    loss, grads = forward_backward(model, params, ids[:, :-1], ids[:, 1:], ids[:, 1:].size)
    h = hashlib.sha256(np.float64(loss).tobytes())
    for name in sorted(grads):
        h.update(name.encode())
        h.update(np.ascontiguousarray(grads[name]).tobytes())
    return h.hexdigest()


def digest_with_threads(function: str, threads: int) -> str:
    """``module:function`` (a digest, e.g. built on ``step_digest``) run in a fresh process with
    ``threads`` worker threads and BLAS threads, as role_env sets them."""
    module, name = function.split(":")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = f"import sys; sys.path.insert(0, {root!r}); from {module} import {name}; print({name}())"
    env = {**os.environ, "WEIGHTSTREAM_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()

"""bench/peer.py's functions: its medians, its appliance step timing, and that the PyTorch peer computes the
appliance's model. Runs of the script end to end are in tests/integration/bench/test_peer.py."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_module import load_bench

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("peer")


def test_medians_leave_out_the_first_two_steps(bench: ModuleType) -> None:
    assert bench.median([100.0, 50.0, 3.0, 1.0, 2.0]) == 2.0
    assert bench.median([100.0, 5.0]) == 5.0  # too few steps: the last one
    assert bench.ratio(3.0, 2.0) == 1.5 and bench.ratio(None, 2.0) is None


ZERO = {"worker_compute_s": 0.0, "worker_wait_s": 0.0, "update_s": 0.0}


def test_appliance_steps_are_timed_from_its_running_average(bench: ModuleType) -> None:
    """metrics.jsonl logs tokens so far / time so far; each step's own time is recovered from it."""
    steps_s = [9.0, 3.0, 2.0, 2.5, 1.5]
    rows, elapsed = [], 0.0
    for i, s in enumerate(steps_s, start=1):
        elapsed += s
        rows.append({"step": i, "tokens_per_second": i * 100 / elapsed, "step_time_s": s} | ZERO)
    got = bench.appliance_summary(rows, 100)
    assert got["step_interval_s"] == pytest.approx(2.0)  # median of the steps after the first 2
    assert got["tokens_per_second"] == pytest.approx(50.0)
    assert got["logged_tokens_per_second"] == pytest.approx(400 / 16.5)  # the running average's median


def test_the_torch_peer_computes_the_appliances_model(bench: ModuleType, tmp_path: Path) -> None:
    """Same weights in, same logits out: the peer is the model the appliance trains (GPT-2's tanh GELU,
    not ModelZoo's default exact one). The MLP weights are scaled up so that GELU sees inputs of order 1,
    where its two forms differ by ~1e-3: the logits then differ by ~3e-5 between the two, by ~3e-7 (float32
    sums in another order) between equal models."""
    import argparse

    import numpy as np
    import torch

    from weightstream.numerics import init_params
    from weightstream.params import load_params, model_def

    a = argparse.Namespace(hidden=64, layers=2, heads=2, vocab=512, seq=32, batch=4, steps=1)
    raw = bench.params_dict(a, tmp_path)
    md = model_def(load_params(raw))
    w = init_params(md, raw["runconfig"]["seed"])
    for name in w:
        if name.endswith("mlp.c_fc.weight"):
            w[name] *= 40.0  # GELU inputs ~N(0, 1.5^2)
    peer = bench.torch_model(raw)
    peer.load_weightstream(w)
    ids = np.random.default_rng(0).integers(0, a.vocab, (2, a.seq))
    x: Any = ids
    for unit in md.units:
        x, _ = unit.forward(w, x)
    with torch.no_grad():
        want = peer(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)

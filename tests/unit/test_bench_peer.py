"""bench/peer.py end to end in a tiny config: its one JSON line, its figures and ratios, and that the
PyTorch peer trains the same model on the same data as the appliance (the losses agree)."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_module import load_bench, run_bench_json

pytest.importorskip("torch")

TINY = ["--hidden", "64", "--layers", "2", "--heads", "2", "--vocab", "512", "--seq", "32", "--batch", "4"]
FIGURES = ("torch_eager", "weightstream_num_csx_1", "torch_ddp_2", "weightstream_num_csx_2")


def run_bench(tmp_path: Path, *extra: str) -> dict[str, Any]:
    return run_bench_json("peer", [*TINY, "--steps", "3", *extra], tmp_path, timeout=120)


@pytest.fixture(scope="module")
def with_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_bench(tmp_path_factory.mktemp("peer"))


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("peer")


@pytest.mark.slow  # the peer bench with DDP (~13 s, shared with the next test): in CI's slow phase
def test_the_json_line_has_every_figure_and_ratios_are_their_quotients(with_ddp: dict[str, Any]) -> None:
    out = with_ddp
    assert out["bench"] == "peer"
    assert out["config"]["hidden"] == 64 and out["config"]["steps"] == 3 and out["config"]["parameters"] > 0
    assert {"cpu", "cores", "ram_gib", "torch", "numpy"} <= out["machine"].keys()
    tps = out["tokens_per_second"]
    assert set(tps) == set(FIGURES)
    assert all(math.isfinite(tps[k]) and tps[k] > 0 for k in FIGURES), tps
    assert out["ratio_weightstream_over_torch"] == pytest.approx(
        tps["weightstream_num_csx_1"] / tps["torch_eager"], rel=2e-3, abs=1e-4
    )
    assert out["ratio_num_csx_2_over_ddp"] == pytest.approx(
        tps["weightstream_num_csx_2"] / tps["torch_ddp_2"], rel=2e-3, abs=1e-4
    )
    split = out["median_s"]
    assert {"step_s", "forward_s", "backward_s", "optim_s"} <= split["torch_eager"].keys()
    assert 4 * 32 / split["torch_eager"]["step_s"] == pytest.approx(tps["torch_eager"], rel=5e-3)
    for k in ("weightstream_num_csx_1", "weightstream_num_csx_2"):
        assert {"step_interval_s", "worker_compute_s", "worker_wait_s", "update_s"} <= split[k].keys()
        assert 4 * 32 / split[k]["step_interval_s"] == pytest.approx(tps[k], rel=5e-3)
        assert out["weightstream_logged_tokens_per_second"][k] > 0


@pytest.mark.slow  # shares the DDP run above
def test_both_sides_train_the_same_model_on_the_same_data(with_ddp: dict[str, Any]) -> None:
    """Same initial weights and batches: every run's first loss is ~ln(vocab) and equal, and the curves
    stay together (float32 sums in another order only)."""
    first = with_ddp["loss_first_step"]
    assert set(first) == set(FIGURES)
    assert all(abs(v - math.log(512)) < 0.5 for v in first.values()), first
    assert all(abs(v - first["torch_eager"]) < 1e-3 for v in first.values()), first
    assert all(d < 1e-2 for d in with_ddp["loss_max_abs_diff_vs_torch_eager"].values())


def test_skip_ddp_reports_num_csx_1_only(tmp_path: Path) -> None:
    out = run_bench(tmp_path, "--skip-ddp")
    tps = out["tokens_per_second"]
    assert tps["torch_ddp_2"] is None and tps["weightstream_num_csx_2"] is None
    assert out["ratio_num_csx_2_over_ddp"] is None
    assert tps["torch_eager"] > 0 and tps["weightstream_num_csx_1"] > 0
    assert out["ratio_weightstream_over_torch"] == pytest.approx(
        tps["weightstream_num_csx_1"] / tps["torch_eager"], rel=2e-3, abs=1e-4
    )


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

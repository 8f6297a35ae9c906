"""bench/peer.py end to end in a tiny config, run as a script: its one JSON line, its figures and ratios,
and that the PyTorch peer trains the same model on the same data as the appliance (the losses agree). Its
functions are tested in tests/unit/bench/test_peer.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.bench_module import run_bench_json

TINY = ["--hidden", "64", "--layers", "2", "--heads", "2", "--vocab", "512", "--seq", "32", "--batch", "4"]


FIGURES = ("torch_eager", "weightstream_num_csx_1", "torch_ddp_2", "weightstream_num_csx_2")


def run_bench(tmp_path: Path, *extra: str) -> dict[str, Any]:
    return run_bench_json("peer", [*TINY, "--steps", "3", *extra], tmp_path, timeout=120)


@pytest.fixture(scope="module")
def with_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_bench(tmp_path_factory.mktemp("peer"))


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

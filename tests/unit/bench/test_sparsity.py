"""bench/sparsity.py: the params it runs are valid, and what it reads from metrics.jsonl and reports."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from tests.bench_module import load_bench
from weightstream.params import load_params, model_def
from weightstream.params.sparsity import model_density


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("sparsity")


def _args() -> argparse.Namespace:
    return argparse.Namespace(layers=2, vocab=2048, seq=128, batch=8, steps=3)


def test_levels_are_valid_params_with_the_asked_density_and_dense_without_a_block(bench: ModuleType) -> None:
    dense = bench.params_dict(_args(), 0.0)
    assert "sparsity" not in dense  # the baseline is the plain dense appliance
    p = load_params(dense)
    assert p.runconfig.data_plane == "grpc" and p.runconfig.num_csx == 1 and p.model.hidden_size == 768
    sparse = load_params(bench.params_dict(_args(), 0.9))
    model = model_def(sparse)
    blocks = sum(model.specs[n].numel for n in model.sparse_candidates)
    assert model_density(sparse, model) == pytest.approx(1 - 0.9 * blocks / model.num_params, abs=1e-6)


def test_medians_skip_the_first_step_and_ratios_are_against_dense(bench: ModuleType) -> None:
    def rows(wire: int, compute: float, first: float) -> list[dict[str, float]]:
        out = [
            {
                "step": 1,
                "loss": 9.0,
                "worker_wire_bytes": 7 * wire,
                "worker_compute_s": first,
                "step_time_s": first,
            }
        ]
        for s, jitter in ((2, 0.9), (3, 1.0), (4, 1.1)):
            out.append(
                {
                    "step": s,
                    "loss": 8.0 - s,
                    "worker_wire_bytes": wire,
                    "worker_compute_s": compute * jitter,
                    "step_time_s": 2 * compute * jitter,
                }
            )
        return [*out, {"step": 4, "eval_loss": 1.0}]

    m = {0.0: bench.measure(rows(1000, 1.0, 50.0)), 0.9: bench.measure(rows(150, 0.5, 50.0))}
    assert m[0.0] == {"wire_bytes": 1000, "worker_s": 1.0, "step_s": 2.0, "loss": 4.0}
    r = bench.ratios(m)
    assert r["0.9"]["wire_bytes_ratio"] == 0.15 and r["0.9"]["worker_time_ratio"] == 0.5
    assert r["0.9"]["step_time_ratio"] == 0.5 and r["0.0"]["wire_bytes_ratio"] == 1.0
    with pytest.raises(SystemExit, match="at least 2"):
        bench.measure(rows(1, 1.0, 1.0)[:1])

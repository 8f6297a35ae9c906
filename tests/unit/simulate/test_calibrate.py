"""Calibration: from N = 1 measurements (a fake metrics.jsonl, fake timings) to a Cluster that reproduces
them, each figure traceable to the measurement it came from."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.simulate_cases import workload
from weightstream.simulate.calibrate import Measurements, NullRun, calibrate, median_steps, read_metrics
from weightstream.simulate.cluster import load_cluster
from weightstream.simulate.model import predict_one, transport_bytes
from weightstream.simulate.workload import Tree, UnitCost

METRICS = [
    {"step": 1, "loss": 9.1, "step_time_s": 9.0, "worker_wait_s": 3.0},  # the first steps warm up
    {"step": 2, "loss": 9.0, "step_time_s": 5.0, "worker_wait_s": 1.0},
    {"step": 3, "loss": 8.9, "step_time_s": 2.0, "worker_wait_s": 0.4},
    {"step": 4, "loss": 8.8, "step_time_s": 2.4, "worker_wait_s": 0.5},
    {"step": 4, "eval_loss": 8.7},  # an evaluation record: no step time
    {"step": 5, "loss": 8.7, "step_time_s": 2.2, "worker_wait_s": 0.4},
]


def write_metrics(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return path


def test_median_step_from_a_metrics_file(tmp_path: Path) -> None:
    rows = read_metrics(write_metrics(tmp_path / "metrics.jsonl", METRICS))
    assert len(rows) == 6
    assert median_steps(rows, skip=2) == pytest.approx(2.2)  # steps 3, 4, 5: 2.0, 2.4, 2.2
    assert median_steps(rows, skip=1) == pytest.approx((2.2 + 2.4) / 2)  # four steps: the middle two
    with pytest.raises(ValueError, match="no step records after step 5"):
        median_steps(rows, skip=5)


def test_a_broken_metrics_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "step_time_s": 1.0}\n{"step": 2, "step_ti\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        read_metrics(path)


def measurements(step_s: float, null_step_s: float = 3.0) -> Measurements:
    # the job: 3 units of 1e8 bytes; the null run: the same units with (next to) no FLOPs
    job = workload(nbytes=1e8, flops=1e9, signature="job")
    null_units = tuple(UnitCost(u.name, u.wire_bytes, u.grad_bytes, 1.0, 2.0) for u in job.units)
    null = workload(nbytes=1e8, signature="null", units=null_units, trees={1: Tree((1,), 1)})
    # 0.1 s forward and 0.2 s backward per unit and sample on one core; twice as fast on two
    by_cores = {1: [(0.1, 0.2)] * 3, 2: [(0.05, 0.1)] * 3}
    cpu = {"memoryx": 0.5, "swarmx": 0.4, "worker": 0.6, "activation": 0.0, "coordinator": 0.0}
    return Measurements(2, by_cores, 1000.0, 2e9, step_s, NullRun(null_step_s, cpu, null))


def test_calibration_reproduces_what_it_was_given() -> None:
    m = measurements(step_s=5.0)
    job = workload(nbytes=1e8, flops=1e9, signature="job")
    cluster = calibrate(m, job)
    assert cluster.core_speedup == pytest.approx((1.0, 2.0))
    assert cluster.unit_seconds == ((0.1, 0.2),) * 3 and cluster.unit_signature == "job"
    assert cluster.memoryx_update_rate == 1000.0 and cluster.swarmx_reduce_rate == 2e9
    assert cluster.shared_host and cluster.host_cores == 2
    # transport: 1.5 CPU-s per step, less the update (1000 parameters at 1000/s) and the null run's compute
    # (9 FLOP at 3e9/0.9 FLOP/s), over (5 x 1e8 down + 3e8 up) x 2 links
    compute = 9.0 * 0.9 / 9e9
    assert cluster.stream_cpu_s_per_byte == pytest.approx((1.5 - 1.0 - compute) / 1.6e9)
    assert transport_bytes(m.null.workload, 1)[0] == pytest.approx(1.6e9)
    # the fitted hop bandwidth gives the null run's step (its barrier counted as transport); what the
    # job's step has beyond the model is the barrier
    null = predict_one(replace(cluster, step_overhead_s=0.0), m.null.workload, 1)
    one = predict_one(cluster, job, 1)
    assert null is not None and one is not None
    assert null.step_s == pytest.approx(3.0, rel=1e-6)
    assert one.step_s == pytest.approx(5.0, rel=1e-6)
    assert cluster.step_overhead_s > 0
    assert any("barrier" in note for note in cluster.notes)


def test_a_step_faster_than_the_model_leaves_no_negative_barrier() -> None:
    m = measurements(step_s=0.5)  # less than the compute alone (0.9 s on two cores)
    cluster = calibrate(m, workload(nbytes=1e8, flops=1e9, signature="job"))
    assert cluster.step_overhead_s == 0.0


def test_a_calibration_file_loads_as_a_cluster(tmp_path: Path) -> None:
    cluster = calibrate(measurements(step_s=5.0), workload(nbytes=1e8, flops=1e9, signature="job"))
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cluster": cluster.to_dict(), "measured": {"step_s_n1": 3.0}}))
    assert load_cluster(path) == cluster


def test_a_tiny_null_run_gives_the_latency_per_hop() -> None:
    # the same 3 units at 1 kB (and 10 parameters: 10 ms of update): bandwidth hardly matters, so its
    # 0.5 s step is nearly all latency
    m = measurements(step_s=5.0)
    tiny_units = tuple(UnitCost(f"u{i}", 1000, 1000, 1.0, 2.0) for i in range(3))
    tiny_workload = workload(signature="tiny", units=tiny_units, trees={1: Tree((1,), 1)}, shard_params=(10,))
    tiny = NullRun(0.5, {}, tiny_workload)
    cluster = calibrate(replace(m, tiny=tiny), workload(nbytes=1e8, flops=1e9, signature="job"))
    assert cluster.link_latency_s > 0
    fit = predict_one(replace(cluster, step_overhead_s=0.0), tiny.workload, 1)
    big = predict_one(replace(cluster, step_overhead_s=0.0), m.null.workload, 1)
    assert fit is not None and big is not None
    assert fit.step_s == pytest.approx(0.5, rel=1e-4)
    assert big.step_s == pytest.approx(3.0, rel=1e-3)  # the bandwidth was fitted again with that latency
    assert "ms per hop" in " ".join(cluster.notes)


def test_a_json_calibration_keeps_figures_json_writes_without_a_dot(tmp_path: Path) -> None:
    # json.dumps writes 1e-09 where YAML 1.1 wants 1.0e-09: read as YAML it would be the string "1e-09"
    calibrated = calibrate(measurements(step_s=5.0), workload(nbytes=1e8, flops=1e9, signature="job"))
    cluster = replace(calibrated, stream_cpu_s_per_byte=1e-09, link_latency_s=2e-05)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cluster": cluster.to_dict()}))
    assert "1e-09" in path.read_text()
    assert load_cluster(path) == cluster


def with_network_null(m: Measurements, step_s: float = 6.0, cpu_s: float = 3.1) -> Measurements:
    """``m`` and its null run again over gRPC: twice as slow, with ``cpu_s`` CPU-seconds a step."""
    cpu = {"memoryx": cpu_s - 2.0, "swarmx": 1.0, "worker": 1.0, "activation": 0.0, "coordinator": 0.0}
    return replace(m, network_null=NullRun(step_s, cpu, m.null.workload))


def test_a_network_null_run_gives_the_network_plane_s_figures() -> None:
    job = workload(nbytes=1e8, flops=1e9, signature="job")
    m = with_network_null(measurements(step_s=5.0))
    assert m.network_null is not None
    shared, both = calibrate(replace(m, network_null=None), job), calibrate(m, job)
    # the shared-memory figures are what they were without the run over gRPC
    no_network = replace(both, network_stream_cpu_s_per_byte=None, network_link_bandwidth=None, notes=())
    assert no_network == replace(shared, notes=())
    # as for shared memory: 3.1 CPU-s per step, less the update and the compute, over 1.6e9 bytes x links
    compute = 9.0 * 0.9 / 9e9
    assert both.network_stream_cpu_s_per_byte == pytest.approx((3.1 - 1.0 - compute) / 1.6e9)
    assert both.network_link_bandwidth is not None and both.network_link_bandwidth < both.link_bandwidth
    # over the network the model gives the gRPC null run's step (no barrier), and is slower for the job
    net = both.over_network()
    null = predict_one(replace(net, step_overhead_s=0.0), m.network_null.workload, 1)
    assert null is not None and null.step_s == pytest.approx(6.0, rel=1e-6)
    for n in (1, 2, 4):
        over_shm, over_net = predict_one(both, job, n), predict_one(net, job, n)
        assert over_shm is not None and over_net is not None
        assert over_net.step_s > over_shm.step_s
    assert predict_one(both, job, 2) == predict_one(shared, job, 2)  # the default is shared memory, as before
    notes = " ".join(both.notes)
    assert (
        "shared memory" in notes
        and "over the network plane on loopback" in notes
        and "--data-plane network" in notes
    )


def test_an_old_calibration_without_network_figures_loads_and_predicts_as_before(tmp_path: Path) -> None:
    job = workload(nbytes=1e8, flops=1e9, signature="job")
    cluster = calibrate(measurements(step_s=5.0), job)
    assert cluster.network_link_bandwidth is None and not cluster.has_network_figures
    old = {k: v for k, v in cluster.to_dict().items() if not k.startswith("network_")}  # written before them
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cluster": old, "measured": {"step_s_n1": 5.0}}))
    loaded = load_cluster(path)
    assert loaded == cluster and loaded.over_network() == cluster
    assert predict_one(loaded, job, 2) == predict_one(cluster, job, 2)


def test_measurements_record_the_network_null_run_when_there_is_one() -> None:
    m = measurements(step_s=5.0)
    assert m.to_dict()["network_null_step_s"] is None and m.to_dict()["network_null_cpu_s_per_step"] is None
    d = with_network_null(m).to_dict()
    assert d["network_null_step_s"] == 6.0 and sum(
        d["network_null_cpu_s_per_step"].values()
    ) == pytest.approx(3.1)

"""bench/hosts.py's arithmetic: the busiest link's use, links capped for the simulator, the errors, and the
JSON's headline keys; bench/broadcast_hosts.py's reading of the switch's counters."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.bench_module import load_bench
from tests.simulate_cases import GB, cluster, workload
from weightstream.simulate.cluster import cerebras_like
from weightstream.simulate.model import predict_one

hosts = load_bench("hosts")
broadcast_hosts = load_bench("broadcast_hosts")

KEYS = ("broadcast_link_ratio_1gbit", "cross_host_step_ratio", "simulate_max_error")


def test_the_busiest_link_is_the_one_that_sent_most_over_its_rate_in_bytes() -> None:
    # SwarmX's host sends each block twice (two children), MemoryX's once
    sent = {"h1": 100_000_000, "h2": 200_000_000, "h3": 5_000, "h4": 6_000}
    host, ratio = hosts.busiest_link(sent, 2.0, "1gbit")
    assert host == "h2"
    assert ratio == pytest.approx(200e6 / 2.0 / 125e6)  # 1 Gbit/s is 125 MB/s
    assert hosts.busiest_link({"h1": 50_000_000}, 1.0, "100mbit")[1] == pytest.approx(4.0)
    with pytest.raises(ValueError):
        hosts.busiest_link(sent, 0.0, "1gbit")


def test_a_link_rate_caps_every_bandwidth_a_host_link_carries_and_only_lowers_them() -> None:
    fast = cerebras_like()
    capped = hosts.at_link_rate(fast, 125e6)
    assert capped.link_bandwidth == capped.memoryx_bandwidth == capped.swarmx_bandwidth == 125e6
    assert capped.swarmx_reduce_rate == fast.swarmx_reduce_rate  # adding up gradients is not a link
    assert hosts.at_link_rate(fast, 1e15) == fast


def test_the_prediction_across_hosts_is_over_the_network_plane_unlimited_and_capped() -> None:
    job = workload(nbytes=1e8, flops=1e9, signature="job")
    base = cluster(workers_per_host=0, host_cores=2, stream_cpu_s_per_byte=1e-10, swarmx_bandwidth=2 * GB)
    with pytest.raises(ValueError, match="no network-plane figures"):
        hosts.predicted_across_hosts(base, job, 125e6)  # never quietly the shared-memory figures
    calibrated = replace(base, network_stream_cpu_s_per_byte=1e-9, network_link_bandwidth=0.5 * GB)
    predicted = hosts.predicted_across_hosts(calibrated, job, 125e6)
    net = calibrated.over_network()
    unlimited, capped = predict_one(net, job, 2), predict_one(hosts.at_link_rate(net, 125e6), job, 2)
    shared = predict_one(base, job, 2)
    assert unlimited is not None and capped is not None and shared is not None
    assert predicted == {"unlimited": unlimited.step_s, "1gbit": capped.step_s}
    assert shared.step_s < unlimited.step_s < capped.step_s


def test_errors_are_relative_to_the_measurement_and_the_figure_is_the_larger() -> None:
    errors = hosts.relative_errors({"unlimited": 1.1, "1gbit": 1.8}, {"unlimited": 1.0, "1gbit": 2.0})
    assert errors == pytest.approx({"unlimited": 0.1, "1gbit": 0.1})
    out = hosts.figures(0.9, 2.3, 2.0, {"unlimited": 0.05, "1gbit": 0.2})
    assert out["cross_host_step_ratio"] == 1.15 and out["simulate_max_error"] == 0.2
    assert out["meets_targets"] == {KEYS[0]: True, KEYS[1]: True, KEYS[2]: False}
    assert hosts.figures(0.79, 2.31, 2.0, {"x": 0.15})["meets_targets"] == {KEYS[0]: False, KEYS[1]: False,
                                                                          KEYS[2]: True}  # fmt: skip
    assert set(KEYS) <= set(out) and out["targets"] == hosts.TARGETS


def test_link_counters_are_read_from_the_switch_ports_named_after_the_hosts() -> None:
    ports = [
        {"ifname": "br0", "stats64": {"rx": {"bytes": 1}, "tx": {"bytes": 2}}},
        {"ifname": "h1", "stats64": {"rx": {"bytes": 300}, "tx": {"bytes": 7}}},
        {"ifname": "h2", "stats64": {"rx": {"bytes": 600}, "tx": {"bytes": 9}}},
    ]
    assert broadcast_hosts.sent_by_host(json.dumps(ports), {"h1", "h2"}) == {"h1": 300, "h2": 600}


def test_quick_is_a_tiny_job_and_the_default_is_scaling_py_s() -> None:
    full = hosts.parse_args([])
    assert (full.hidden, full.layers, full.vocab, full.seq, full.per_worker_batch) == (512, 4, 8192, 256, 8)
    assert (full.bw_hidden, full.repeats) == (1024, 5)
    quick = hosts.parse_args(["--quick"])
    assert quick.hidden < full.hidden and quick.steps < full.steps and quick.repeats < full.repeats

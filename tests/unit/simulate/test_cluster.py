"""``Cluster``'s network-plane figures: checked like the rest, put in place by ``over_network``, and absent
from old files without changing anything."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from weightstream.simulate.cluster import Cluster, ClusterError

GB = 1e9


def cluster(**kw: Any) -> Cluster:
    """1 GB/s per link, MemoryX shard and SwarmX node; figures in ``kw`` replace these."""
    fields: dict[str, Any] = {"name": "test", "worker_flops": 1e12, "link_bandwidth": GB}
    fields |= {"memoryx_bandwidth": GB, "swarmx_bandwidth": GB, "swarmx_reduce_rate": GB}
    return Cluster(**{**fields, **kw})


def test_over_network_puts_the_network_figures_in_place_keeping_each_node_s_share() -> None:
    # a calibration's shape: MemoryX moves one link's worth, a SwarmX node two (two cores)
    c = cluster(
        swarmx_bandwidth=2 * GB,
        stream_cpu_s_per_byte=1e-10,
        network_stream_cpu_s_per_byte=4e-10,
        network_link_bandwidth=0.25 * GB,
        notes=("measured: something",),
    )
    net = c.over_network()
    assert net.stream_cpu_s_per_byte == 4e-10
    assert (net.link_bandwidth, net.memoryx_bandwidth, net.swarmx_bandwidth) == (
        0.25 * GB,
        0.25 * GB,
        0.5 * GB,
    )
    assert net.swarmx_reduce_rate == c.swarmx_reduce_rate  # adding up gradients is no transfer
    assert net.link_latency_s == c.link_latency_s and net.host_cores == c.host_cores
    assert net.notes[0] == "measured: something" and "network data plane" in net.notes[-1]
    assert "0.40 CPU-ns per byte" in net.notes[-1] and "0.25 GB/s per hop" in net.notes[-1]
    # the result's own figures are the network's: asking again changes nothing
    assert not net.has_network_figures and net.over_network() == net


def test_a_cluster_without_network_figures_is_the_same_over_the_network() -> None:
    c = cluster(stream_cpu_s_per_byte=1e-10)
    assert not c.has_network_figures and c.over_network() == c
    # one figure measured: the other stays the cluster's own
    cpu_only = replace(c, network_stream_cpu_s_per_byte=3e-10).over_network()
    assert cpu_only.stream_cpu_s_per_byte == 3e-10 and cpu_only.link_bandwidth == c.link_bandwidth


def test_network_figures_round_trip_and_old_files_load_without_them() -> None:
    c = cluster(network_stream_cpu_s_per_byte=4e-10, network_link_bandwidth=0.25 * GB)
    assert Cluster.from_dict(c.to_dict()) == c
    old = {k: v for k, v in c.to_dict().items() if not k.startswith("network_")}
    assert Cluster.from_dict(old).network_link_bandwidth is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("network_link_bandwidth", 0.0, "network_link_bandwidth: 0.0, expected a number > 0 or null"),
        ("network_link_bandwidth", float("nan"), "network_link_bandwidth: nan, expected a number > 0"),
        (
            "network_stream_cpu_s_per_byte",
            -1e-9,
            "network_stream_cpu_s_per_byte: -1e-09, expected a number >= 0",
        ),
        ("network_stream_cpu_s_per_byte", "fast", "network_stream_cpu_s_per_byte: 'fast', expected"),
    ],
)
def test_bad_network_figures_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ClusterError) as e:
        cluster(**{field: value})
    assert message in str(e.value)

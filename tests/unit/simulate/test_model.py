"""The cost model's arithmetic on cases small enough to work out by hand (numbers in the comments)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.simulate_cases import GB, SMALL_GPT2, cluster, workload
from weightstream.params import load_params
from weightstream.simulate.cluster import Cluster, ClusterError, cerebras_like
from weightstream.simulate.model import expected_max_normal, hop_times, predict, predict_one
from weightstream.simulate.workload import Tree, build_workload, tree_of

# links, nodes and adds so fast that only compute and cores count
FAST = {
    "link_bandwidth": 1e15,
    "swarmx_bandwidth": 1e15,
    "memoryx_bandwidth": 1e15,
    "swarmx_reduce_rate": 1e15,
}


@pytest.mark.parametrize(
    ("n", "fans", "nodes"),
    [
        (1, (1,), 1),
        (4, (4,), 1),  # one node while N <= fan-out
        (5, (4, 2), 3),  # leaves of 4 and 1, a root over them
        (16, (4, 4), 5),
        (17, (4, 4, 2), 8),  # 5 leaves, 2 nodes over them, a root
        (192, (4, 4, 4, 3), 64),  # 48 leaves, 12, 3, the root: depth 4
    ],
)
def test_tree_depth_and_fans_are_the_plans(n: int, fans: tuple[int, ...], nodes: int) -> None:
    tree = tree_of(load_params(SMALL_GPT2), n, 4)
    assert (tree.fans, tree.nodes, tree.depth) == (fans, nodes, len(fans))


def test_hop_times_down_and_up() -> None:
    # a 1 GB unit, N=16 (fans 4, 4): MemoryX -> root 1 s; each level serves 4 copies from one node: 4 s
    c = cluster(link_latency_s=0.5)
    assert hop_times(c, GB, (4, 4), up=False) == pytest.approx([1.5, 4.5, 4.5])
    # up: each node takes 4 gradients in (4 s) and adds them (4 GB at 1 GB/s: 4 s)
    assert hop_times(c, GB, (4, 4), up=True) == pytest.approx([1.5, 8.5, 8.5])


def test_compute_bound_step_is_compute_plus_fill_turn_and_drain() -> None:
    # 3 units of 1e12 FLOP forward (1 s at 1 TFLOP/s), 2 s backward; 1 MB units take 2 ms over 2 hops
    w = workload(nbytes=1e6)
    p = predict_one(cluster(), w, 1)
    assert p is not None
    assert p.terms["compute"] == pytest.approx(9.0)
    # exposed: the first unit's broadcast, the first backward fetch (the turn), the last reduction
    assert p.terms["broadcast"] == pytest.approx(0.004)
    assert p.terms["reduce"] == pytest.approx(0.002)
    assert p.limit == "compute"


def test_broadcast_bound_timeline_by_hand() -> None:
    # units of 1 GB over 2 hops: 2 s per broadcast and per reduction; forward 0.5 s, backward 1 s per unit.
    # forward: wait 2 (fill), compute 0.5, wait 1.5, 0.5, wait 1.5, 0.5 -> t = 6.5
    # backward: unit 2 (kept) 1 s -> 7.5, its push done at 9.5; fetch unit 1: wait 2 -> 9.5; 1 s -> 10.5;
    # fetch unit 0 (started at 9.5) arrives 11.5: wait 1 -> 11.5; 1 s -> 12.5; the push of unit 1 is
    # done (12.5); push unit 0, done at 14.5: drain 2 s
    w = workload(flops=0.5e12)
    p = predict_one(cluster(), w, 1)
    assert p is not None
    assert p.terms["compute"] == pytest.approx(4.5)
    assert p.terms["broadcast"] == pytest.approx(8.0)
    assert p.terms["reduce"] == pytest.approx(2.0)
    assert p.terms["compute"] + p.terms["broadcast"] + p.terms["reduce"] == pytest.approx(14.5)
    assert p.limit == "broadcast"


def test_cut_through_broadcast_pays_one_hop_and_a_message_per_other_hop() -> None:
    # the broadcast case above, cut through (as swarmx/node.py relays): a 1 GB unit over 2 hops of 1 s
    # arrives after b = 1 s + one 4 MiB message at the other hop. Forward: fill b, then 2 waits of b - 0.5;
    # backward: unit 1's fetch (started after the head's backward) b, unit 0's b - 1 -> 5b - 2 in all.
    # The reduction still takes each hop whole (2 s): unit 1's push (4b + 2.5 to 4b + 4.5) is still going
    # when unit 0's backward ends (5b + 2.5), so the worker waits 2 - b for it, then the 2 s drain.
    assert cerebras_like().relay == "cut_through"  # the default: how swarmx/node.py relays
    b = 1.0 + (4 << 20) / GB
    p = predict_one(cluster(relay="cut_through"), workload(flops=0.5e12), 1)
    assert p is not None
    assert p.terms["broadcast"] == pytest.approx(5 * b - 2)
    assert p.terms["reduce"] == pytest.approx(4 - b)


def test_reduce_bound_timeline_by_hand() -> None:
    # N=2 on one node that sends 2 copies at 2 GB/s (1 s) but adds gradients at 0.5 GB/s: a broadcast
    # takes 1 + 1 = 2 s, a reduction 1 + (1 + 2 GB / 0.5 GB/s) = 6 s. Forward as in the broadcast case
    # (t = 6.5, 5 s waiting). Backward: unit 2 -> 7.5, its push done at 13.5; unit 1 arrives 9.5 (wait 2),
    # -> 10.5, waits for the push until 13.5 (3), its push done 19.5; unit 0 (here since 11.5) -> 14.5,
    # waits until 19.5 (5), its push done 25.5: a 6 s drain
    c = cluster(swarmx_bandwidth=2 * GB, swarmx_reduce_rate=0.5 * GB)
    p = predict_one(c, workload(flops=0.5e12), 2)
    assert p is not None
    assert p.terms["broadcast"] == pytest.approx(7.0)
    assert p.terms["reduce"] == pytest.approx(3.0 + 5.0 + 6.0)
    assert p.limit == "reduce"


def test_pipelined_streams_each_unit_once() -> None:
    w = workload(flops=0.5e12, pipelined=True)
    p = predict_one(cluster(), w, 1)
    assert p is not None
    # forward as above (5 s waiting); backward has nothing to fetch: 1 s per unit, the pushes (2 s each)
    # hold it back: unit 1 waits 1 s for unit 2's push, unit 0 waits 1 s for unit 1's, then a 2 s drain
    assert p.terms["broadcast"] == pytest.approx(5.0)
    assert p.terms["reduce"] == pytest.approx(4.0)


def test_more_workers_deepen_the_tree_and_slow_the_broadcast() -> None:
    w = workload(nbytes=1e6)
    one, four, sixteen = (predict_one(cluster(), w, n) for n in (1, 4, 16))
    assert one and four and sixteen
    # a unit at N=4: 1 ms from MemoryX, 4 ms from the node serving 4; at N=16 another 4 ms level
    assert four.terms["broadcast"] == pytest.approx(2 * 0.005)
    assert sixteen.terms["broadcast"] == pytest.approx(2 * 0.009)
    assert sixteen.tree_depth == 2


def test_shared_host_cores_limit_the_step() -> None:
    # every role on one 2-core host; 4 workers get 1 core each and 4 s of single-core compute each:
    # they need 16 core-seconds, the host has 2 cores: 8 s, of which 4 s are compute on the path
    c = cluster(workers_per_host=0, host_cores=2, core_speedup=(1.0, 2.0), **FAST)
    w = workload(count=1, nbytes=1, flops=4e12 / 3)  # forward + backward = 4e12 FLOP: 4 s on one core
    four = predict_one(c, w, 4)
    assert four is not None
    assert four.terms["compute"] == pytest.approx(4.0)
    assert four.terms["cores"] == pytest.approx(4.0, rel=1e-6)
    assert four.limit == "compute" or four.limit == "cores"
    # one worker gets both cores (speedup 2): 2 s, both cores busy, nothing over
    one = predict_one(c, w, 1)
    assert one is not None
    assert one.terms["compute"] == pytest.approx(2.0)
    assert one.terms["cores"] == pytest.approx(0.0, abs=1e-9)


def test_shared_host_transport_cpu_competes_with_compute() -> None:
    # one 1 GB unit at N=1 crosses the 2 links (MemoryX -> node -> worker) once down (backward keeps the
    # last unit) and once up: 4e9 byte-links at 1 ns: 4 CPU-seconds on top of 2 cores x 2 s of compute,
    # on 2 cores: 4 s
    c = cluster(workers_per_host=0, host_cores=2, core_speedup=(1.0, 2.0), stream_cpu_s_per_byte=1e-9, **FAST)
    w = workload(count=1, nbytes=GB, flops=4e12 / 3)
    p = predict_one(c, w, 1)
    assert p is not None
    assert p.terms["compute"] + p.terms["cores"] == pytest.approx((2 * 2.0 + 4.0) / 2, rel=1e-4)


def test_update_and_barrier() -> None:
    c = cluster(
        memoryx_update_rate=100.0, step_overhead_s=0.25, per_worker_overhead_s=0.01, worker_jitter=0.1
    )
    w = workload(nbytes=1, shard_params=(300, 100))  # the fuller shard sets the pace: 3 s
    p = predict_one(c, w, 4)
    assert p is not None
    assert p.terms["update"] == pytest.approx(3.0)
    worker_s = p.terms["compute"] + p.terms["broadcast"] + p.terms["reduce"]
    assert p.terms["barrier"] == pytest.approx(0.25 + 4 * 0.01 + 0.1 * expected_max_normal(4) * worker_s)
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(0.5642, abs=1e-4)  # exactly 1/sqrt(pi)
    assert expected_max_normal(4) == pytest.approx(1.0294, abs=1e-4)  # tables of normal order statistics


def test_efficiency_is_throughput_over_n_times_one() -> None:
    w = workload(nbytes=1e8)
    preds = predict(cluster(), w, [1, 4, 16])
    one = preds[0]
    assert one is not None and one.efficiency == pytest.approx(1.0)
    for p in preds[1:]:
        assert p is not None
        assert p.efficiency == pytest.approx(p.tokens_per_s / (p.n * one.tokens_per_s))
        assert p.tokens_per_s == pytest.approx(p.n * 1 * 10 / p.step_s)
    assert preds[2] and preds[1] and preds[2].efficiency < preds[1].efficiency <= 1.0


def test_held_global_batch_splits_or_is_refused() -> None:
    w = workload(per_worker_batch=None, global_batch=8, trees={1: Tree((1,), 1), 3: Tree((3,), 1)})
    assert predict(cluster(), w, [1, 3])[1] is None  # 8 samples do not split over 3 workers
    assert w.batch(1) == 8


def test_workload_from_params_counts_bytes_and_flops() -> None:
    w = build_workload(load_params(SMALL_GPT2), [1, 2], fanout=4, shards=2)
    emb, block, head = w.units[0], w.units[1], w.units[-1]
    c, t, v, f = 32, 16, 64, 128
    assert emb.wire_bytes == (v * c + 16 * c) * 4 and emb.fwd_flops == 0
    assert block.wire_bytes == (4 * c * c + 2 * c * f + 9 * c + f) * 4
    assert block.fwd_flops == 2 * t * (4 * c * c + 2 * c * f) + 4 * t * t * c
    assert head.fwd_flops == 2 * t * c * v and head.bwd_flops == 2 * head.fwd_flops
    assert sum(w.shard_params) == w.num_params and len(w.shard_params) == 2
    assert w.per_worker_batch == 8 and w.tokens_per_sample == 16
    bf16_params = {**SMALL_GPT2, "model": {**SMALL_GPT2["model"], "fp16_type": "bfloat16"}}
    bf16 = build_workload(load_params(bf16_params), [1], 4, 1)
    assert bf16.units[1].wire_bytes == block.wire_bytes // 2


def test_cluster_rejects_bad_figures_naming_them() -> None:
    with pytest.raises(ClusterError, match=r"link_bandwidth: -1\.0, expected a number > 0"):
        replace(cerebras_like(), link_bandwidth=-1.0)
    with pytest.raises(ClusterError, match="swarmx_fanout: 1"):
        replace(cerebras_like(), swarmx_fanout=1)
    with pytest.raises(ClusterError, match=r"unknown field.*linkbandwidth"):
        Cluster.from_dict({"name": "x", "worker_flops": 1.0, "linkbandwidth": 1.0})
    with pytest.raises(ClusterError, match="worker_flops"):
        Cluster(name="no compute")

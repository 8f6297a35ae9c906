"""Where the Slurm backend puts each role, and how it reads Slurm's answers: pure functions, no cluster."""

from __future__ import annotations

import pytest

from weightstream.backends.slurm.commands import granted_job, parse_nodes
from weightstream.backends.slurm.placement import Node, NodeRule, PlacementError, PlacementRules, place
from weightstream.plan import REPLICA

GPT2_2CSX = {"memoryx": 2, "swarmx": 1, "activation": 1, "worker": 2}


def nodes(*names: str, features: str = "", partition: str = "all") -> list[Node]:
    feats = frozenset(f for f in features.split(",") if f)
    return [Node(n, f"10.0.0.{i}", frozenset({partition}), feats, 4) for i, n in enumerate(names, 1)]


def by_role(counts: dict[str, int], given: list[Node], rules: PlacementRules | None = None) -> dict[str, str]:
    return {role: node.name for role, node in place(counts, given, rules).nodes.items()}


def test_workers_each_on_a_node_of_their_own_and_servers_apart_from_them() -> None:
    placed = by_role(GPT2_2CSX, nodes("h1", "h2", "h3", "h4"))
    assert placed == {"worker-0": "h1", "worker-1": "h2", "activation-0": "h1",
                      "memoryx-0": "h3", "memoryx-1": "h4", "swarmx-0": "h3"}  # fmt: skip
    assert len(set(placed.values())) >= 3  # --num_csx 2 on 4 idle nodes uses at least 3 of them


def test_nodes_are_taken_in_slurms_order_numbers_as_numbers() -> None:
    placed = by_role({"worker": 2}, nodes("n10", "n2", "n1"))
    assert placed == {"worker-0": "n1", "worker-1": "n2"}


def test_activation_servers_go_beside_the_workers_they_feed() -> None:
    placed = by_role({"worker": 3, "activation": 3, "memoryx": 1}, nodes("a", "b", "c", "d"))
    assert [placed[f"activation-{i}"] for i in range(3)] == [placed[f"worker-{i}"] for i in range(3)]
    placed = by_role({"worker": 3, "activation": 1}, nodes("a", "b", "c"))
    assert placed["activation-0"] == placed["worker-0"]


def test_servers_share_the_workers_nodes_only_when_there_are_no_others() -> None:
    placed = by_role(GPT2_2CSX, nodes("h1", "h2"))
    assert {placed["memoryx-0"], placed["memoryx-1"], placed["swarmx-0"]} <= {"h1", "h2"}
    assert placed["worker-0"] != placed["worker-1"]
    placed = by_role(GPT2_2CSX, nodes("h1", "h2", "h3"))
    assert {placed["memoryx-0"], placed["memoryx-1"], placed["swarmx-0"]} == {"h3"}


def test_node_features_choose_the_nodes_of_each_group() -> None:
    given = [*nodes("s1", "s2", features="big"), *nodes("w1", "w2", "w3", features="fast")]
    rules = PlacementRules(workers=NodeRule(features=("fast",)), servers=NodeRule(features=("big",)))
    placed = by_role(GPT2_2CSX, given, rules)
    assert {placed["worker-0"], placed["worker-1"], placed["activation-0"]} <= {"w1", "w2", "w3"}
    assert {placed["memoryx-0"], placed["memoryx-1"], placed["swarmx-0"]} <= {"s1", "s2"}


def test_partitions_choose_the_nodes_of_each_group() -> None:
    given = [*nodes("c1", "c2", partition="cpu"), *nodes("g1", "g2", partition="gpu")]
    rules = PlacementRules(workers=NodeRule("gpu"), servers=NodeRule("cpu"))
    placed = by_role(GPT2_2CSX, given, rules)
    assert (placed["worker-0"], placed["worker-1"]) == ("g1", "g2")
    assert placed["memoryx-0"] == "c1"


def test_too_few_nodes_names_what_is_missing() -> None:
    with pytest.raises(PlacementError, match=r"3 CS-2 workers need 3 nodes of their own \(any partition\); "
                       r"2 of the 2 nodes given can serve them: h1, h2"):  # fmt: skip
        place({"worker": 3}, nodes("h1", "h2"))
    rules = PlacementRules(workers=NodeRule("all", ("fast",)))
    with pytest.raises(PlacementError, match=r"partition all with feature fast.*none"):
        place({"worker": 1}, nodes("h1"), rules)
    rules = PlacementRules(servers=NodeRule(features=("big",)))
    with pytest.raises(PlacementError, match=r"MemoryX and SwarmX roles need a node \(any partition with "
                       r"feature big\)"):  # fmt: skip
        place(GPT2_2CSX, nodes("h1", "h2", "h3"), rules)


def test_node_names_lists_each_node_used_once() -> None:
    # three server roles, one a node as far as they go: the sixth node stays free
    given = nodes("h1", "h2", "h3", "h4", "h5", "h6")
    assert place(GPT2_2CSX, given).node_names() == ["h1", "h2", "h3", "h4", "h5"]


def test_sinfo_output_is_read_with_every_partition_of_a_node() -> None:
    text = ("h1|all*|(null)|idle|2|198.18.0.11\nh1|fast|(null)|idle|2|198.18.0.11\n"
            "h2|all*|big,ssd|down*|8|198.18.0.12\n")  # fmt: skip
    states, default = parse_nodes(text)
    assert default == "all"
    assert [(s.node.name, s.state, s.idle, s.usable) for s in states] == [
        ("h1", "idle", True, True), ("h2", "down*", False, False)]  # fmt: skip
    assert states[0].node.partitions == {"all", "fast"} and states[0].node.features == frozenset()
    assert states[1].node == Node("h2", "198.18.0.12", frozenset({"all"}), frozenset({"big", "ssd"}), 8)


def test_the_job_id_salloc_names() -> None:
    assert granted_job("salloc: Granted job allocation 12\n") == "12"
    assert granted_job("salloc: Pending job allocation 7\nsalloc: error: timed out\n") == "7"
    assert granted_job("salloc: error: invalid partition specified: x\n") is None


def test_a_replica_goes_on_another_node_than_its_shard_where_there_is_one() -> None:
    counts = {**GPT2_2CSX, REPLICA: 2}
    placed = by_role(counts, nodes("h1", "h2", "h3", "h4", "h5"))
    for i in range(2):
        assert placed[f"{REPLICA}-{i}"] != placed[f"memoryx-{i}"]
    assert placed[f"{REPLICA}-0"] not in (placed["worker-0"], placed["worker-1"])  # servers' nodes first
    one = by_role({"memoryx": 1, REPLICA: 1}, nodes("h1"))
    assert one == {"memoryx-0": "h1", f"{REPLICA}-0": "h1"}  # no other node: beside it rather than not at all

"""Where the Slurm backend puts each role, and how it reads Slurm's answers: pure functions, no cluster."""

from __future__ import annotations

import pytest

from weightstream.backends.slurm.commands import describe_srun_exit, granted_job, parse_nodes
from weightstream.backends.slurm.placement import (
    Node,
    NodeRule,
    PlacementError,
    PlacementRules,
    place,
    replacement,
)

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


def test_a_roles_end_as_its_srun_tells_it() -> None:
    assert describe_srun_exit(137) == "was killed by SIGKILL"
    assert describe_srun_exit(143) == "stopped on SIGTERM (exit status 143)"
    assert describe_srun_exit(0) == "exited with status 0"
    # srun exits 0 when Slurm declares the node under its task down: what it wrote says so
    said = "srun: error: Node failure on h3\n"
    assert describe_srun_exit(0, said) == "was lost with its node (Slurm declared h3 down: node failure)"


def test_the_job_id_salloc_names() -> None:
    assert granted_job("salloc: Granted job allocation 12\n") == "12"
    assert granted_job("salloc: Pending job allocation 7\nsalloc: error: timed out\n") == "7"
    assert granted_job("salloc: error: invalid partition specified: x\n") is None


REPLICATED = {**GPT2_2CSX, "memoryx-replica": 2}


def test_replicas_go_apart_from_their_shards_and_from_the_workers() -> None:
    placed = by_role(REPLICATED, nodes(*(f"h{i}" for i in range(1, 9))))
    assert placed["memoryx-replica-0"] == "h6" and placed["memoryx-replica-1"] == "h7"  # free nodes first
    placed = by_role(REPLICATED, nodes("h1", "h2", "h3", "h4"))
    assert (placed["memoryx-0"], placed["memoryx-1"]) == ("h3", "h4")
    assert (placed["memoryx-replica-0"], placed["memoryx-replica-1"]) == ("h4", "h3")  # not the workers'
    placed = by_role({"worker": 1, "memoryx": 1, "memoryx-replica": 1}, nodes("h1"))
    assert placed["memoryx-replica-0"] == "h1"  # one node: with its shard, the only place there is


def replace_on(
    lost: list[str],
    counts: dict[str, int],
    names: list[str],
    serving: list[str],
    avoid: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Where ``lost`` go after a fault of a job placed on ``names``, ``serving`` the nodes that serve now."""
    given = nodes(*names)
    placed = place(counts, given).nodes
    now = [n for n in given if n.name in serving]
    return {role: node.name for role, node in replacement(lost, placed, now, avoid).items()}


EIGHT = [f"h{i}" for i in range(1, 9)]


def test_a_role_whose_process_died_goes_back_to_its_node() -> None:
    assert replace_on(["worker-1", "memoryx-0"], REPLICATED, EIGHT, EIGHT) == {
        "worker-1": "h2",
        "memoryx-0": "h3",
    }


def test_a_lost_nodes_roles_go_to_free_nodes_keeping_the_shape() -> None:
    # h1 (worker-0, activation-0) is gone: the worker moves to the free node, its activation server with it
    serving = [n for n in EIGHT if n != "h1"]
    assert replace_on(["worker-0", "activation-0"], REPLICATED, EIGHT, serving) == {
        "worker-0": "h8", "activation-0": "h8"}  # fmt: skip
    # a shard's host gone (h3): not onto its replica's node (h6), nor a worker's
    serving = [n for n in EIGHT if n not in ("h3", "h8")]
    moved = replace_on(["memoryx-0"], REPLICATED, EIGHT, serving)["memoryx-0"]
    assert moved not in ("h3", "h6", "h1", "h2")


def test_a_node_that_did_not_answer_is_avoided_before_slurm_marks_it() -> None:
    # Slurm still lists h2 as serving, but its step did not end when cancelled: the worker goes elsewhere
    moved = replace_on(["worker-1"], GPT2_2CSX, EIGHT, EIGHT, avoid=frozenset({"h2"}))
    assert moved == {"worker-1": "h6"}  # a node with no role at all: h3-h5 hold the servers
    four = ["h1", "h2", "h3", "h4"]
    moved = replace_on(["worker-1"], GPT2_2CSX, four, four, avoid=frozenset({"h2"}))
    assert moved["worker-1"] in ("h3", "h4")  # never beside the other worker while a node has none


def test_no_node_left_says_which_were_avoided() -> None:
    with pytest.raises(PlacementError, match=r"no node left for worker-1: .*avoided \(h1, h2\)"):
        replace_on(["worker-1"], {"worker": 2}, ["h1", "h2"], ["h1", "h2"], avoid=frozenset({"h1", "h2"}))

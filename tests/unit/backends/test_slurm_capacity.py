"""Where the Slurm backend starts lost roles again, and which have no room (backends/slurm/capacity.py): a
worker takes a node whole, so a lost worker has room only on a node no other worker holds; any other role
is started wherever ``placement.replacement`` puts it."""

from __future__ import annotations

import pytest

from weightstream.backends.base import NoCapacityError, RoleSpec
from weightstream.backends.slurm.capacity import nodes_for, refuse_unplaced, without_room
from weightstream.backends.slurm.placement import Node, PlacementError, PlacementRules

H1, H2, H3 = Node("h1", "10.0.0.1"), Node("h2", "10.0.0.2"), Node("h3", "10.0.0.3")
W0, W1, W2 = RoleSpec("worker", 0), RoleSpec("worker", 1), RoleSpec("worker", 2)
NOTHING: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())


def test_a_worker_has_no_room_beside_another_worker() -> None:
    running = {"worker-0": H1, "memoryx-0": H3}
    assert without_room([W1], {"worker-1": H2}, running) == []
    assert without_room([W1], {"worker-1": H1}, running) == [W1]
    assert without_room([W1], {"worker-1": H3}, running) == []  # a server's node is no worker's
    # two lost workers chosen for one free node: the first has it
    assert without_room([W1, W2], {"worker-1": H2, "worker-2": H2}, running) == [W2]


def test_other_roles_are_never_left_out() -> None:
    lost = [RoleSpec(k, 0) for k in ("memoryx", "memoryx-replica", "swarmx", "activation")]
    chosen = {r.name: H1 for r in lost}
    assert without_room(lost, chosen, {"worker-0": H1}) == []


def test_a_lost_workers_node_gone_and_no_free_node_leaves_it_out() -> None:
    placed = {"worker-0": H1, "worker-1": H2, "memoryx-0": H3}
    running = {"worker-0": H1, "memoryx-0": H3}
    # h2 (worker-1's) does not serve; h1 holds worker-0, h3 the shard: the shard's node is free of workers
    chosen, unplaced = nodes_for([W1], placed, [H1, H3], NOTHING, PlacementRules(), running)
    assert chosen["worker-1"] == H3 and unplaced == []
    chosen, unplaced = nodes_for([W1], placed, [H1], NOTHING, PlacementRules(), running)
    assert unplaced == [W1]
    with pytest.raises(NoCapacityError, match="worker-1"):
        refuse_unplaced(unplaced, "7")


def test_no_node_at_all_is_no_capacity_for_workers_and_an_error_for_others() -> None:
    placed = {"worker-0": H1, "memoryx-0": H3}
    with pytest.raises(NoCapacityError) as e:
        nodes_for([W0], placed, [], NOTHING, PlacementRules(), {})
    assert e.value.roles == [W0]
    with pytest.raises(PlacementError):
        nodes_for([RoleSpec("memoryx", 0)], placed, [], NOTHING, PlacementRules(), {})

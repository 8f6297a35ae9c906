"""The Slurm backend's one decision about capacity (backends/slurm/capacity.py): a lost worker whose node,
its own or the least busy one of the allocation that serves, does not serve has no room now; any other role
is started regardless, as before."""

from __future__ import annotations

from weightstream.backends.base import RoleSpec
from weightstream.backends.slurm.capacity import no_room_for_worker
from weightstream.backends.slurm.placement import Node

H2, H3 = Node("h2", "10.0.0.2"), Node("h3", "10.0.0.3")


def test_a_worker_has_room_only_on_a_node_that_serves() -> None:
    worker = RoleSpec("worker", 1)
    assert not no_room_for_worker(worker, H2, {"h2", "h3"})
    assert no_room_for_worker(worker, H2, {"h3"})  # h2 drained or down, and no other node chosen
    assert no_room_for_worker(worker, H3, set())


def test_other_roles_are_never_left_out() -> None:
    for kind in ("memoryx", "memoryx-replica", "swarmx", "activation"):
        assert not no_room_for_worker(RoleSpec(kind, 0), H2, set())

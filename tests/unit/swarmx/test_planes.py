"""A SwarmX node between planes (swarmx/service.py): what reaches it in shared memory goes on inline to a
peer on the network (a child's weights, a single child's gradients), and as it came to a peer that shares
its memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import weightstream.transport.peers as peers
from tests.role_jobs import arena_tag, direct_context, tiny_role_job
from tests.swarmx_fakes import push_through
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import RoleHost
from weightstream.swarmx import service as swarmx_service
from weightstream.transport.plane import NETWORK, SHARED_MEMORY, NetworkPlane
from weightstream.transport.shm import REFERENCES_ONLY, SharedArena
from weightstream.transport.tensors import references_only, tensor_messages

# roles built here ask peers that do not exist where they run: they answer "this host"
pytestmark = pytest.mark.usefixtures("peers_share_memory")


def _root(tmp_path: Path, num_csx: int = 1) -> tuple[RoleHost, Any]:
    job = tiny_role_job(tmp_path, "swarmx", num_csx=num_csx)
    host = RoleHost("swarmx", swarmx_service.build, "c" * 64)
    host.configure(job)
    return host, job


@pytest.mark.parametrize(("child", "inline"), [(NETWORK, True), (SHARED_MEMORY, False)])
def test_weights_in_shared_memory_go_inline_to_a_child_on_the_network(
    tmp_path: Path, child: str, inline: bool
) -> None:
    host, job = _root(tmp_path)
    arena = SharedArena(arena_tag(job))
    w = arena.empty((256,))
    w[...] = np.arange(256, dtype=np.float32)
    header = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))  # what MemoryX on this host answers
    logic = host.logic(direct_context())
    assert logic.upstream.reader.kind == SHARED_MEMORY
    logic.upstream.fetch_unit = lambda step, unit, pass_: iter(header)
    servicer = swarmx_service.SwarmXServicer(host)
    got = list(servicer.GetUnit(pb.UnitRequest(step=0, unit=1, phase=0), direct_context(child)))
    if inline:  # a child on another host reads every byte from the stream
        assert sum(map(len, got)) > w.nbytes
        _, out = NetworkPlane().read(iter(got))
        np.testing.assert_array_equal(out["w"], w)
    else:  # a child on this host gets MemoryX's header as it came
        assert got == header
    host.close()
    arena.close()


def test_a_single_childs_gradients_go_up_inline_to_shards_on_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its child shares the node's memory, the MemoryX shards are on another host: the gradients are read
    out of the child's memfd here and pushed to the shards in the stream."""
    monkeypatch.setattr(peers, "ask_peer", lambda address, token: pb.HealthReply(host="elsewhere/b/1"))
    host, job = _root(tmp_path)
    logic = host.logic(direct_context())
    assert not logic.upstream.shares_memory and logic.children.kind == SHARED_MEMORY
    received: list[bytes] = []

    def push(messages: Any, timeout: float) -> pb.Ack:
        received.extend(messages)
        return pb.Ack()

    push_through(logic.upstream, [push] * len(logic.upstream.planes))
    name = logic.upstream.model.units[1].param_names[0]
    g = np.full(logic.upstream.model.specs[name].shape, 0.25, np.float32)
    arena = SharedArena(arena_tag(job))
    with arena.lease() as scratch:
        msgs = list(tensor_messages([(name, g)], pb.StreamHead(step=0, unit=1, sender=0), shm=scratch))
        assert references_only(msgs) is not None
        swarmx_service.SwarmXServicer(host).PushGradients(iter(msgs), direct_context(SHARED_MEMORY))
    assert references_only(received) is None
    _, out = NetworkPlane().read(iter(received))
    np.testing.assert_array_equal(out[name], g)
    host.close()
    arena.close()

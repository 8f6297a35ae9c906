"""A single-child SwarmX node on the shared-memory plane passes its child's gradients on as the header that
names them (swarmx/node.py's ``relay_grads``): MemoryX receives the child's own memfd locations and
checksums, SwarmX never maps or reads the bytes, and the check stays end to end, at MemoryX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import weightstream.transport.tensors as tensors_module
from tests.role_jobs import arena_tag, direct_context, tiny_role_job
from tests.swarmx_fakes import push_through
from weightstream.params import load_params, model_def
from weightstream.plan import JobSpec, make_plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import RoleHost, shm_tag
from weightstream.swarmx import service as swarmx_service
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.plane import SharedMemoryPlane
from weightstream.transport.shm import SharedArena, locate
from weightstream.transport.tensors import read_messages, references_only, tensor_messages

# roles built here ask peers that do not exist where they run: they answer "this host"
pytestmark = pytest.mark.usefixtures("peers_share_memory")


def _swarmx(tmp_path: Path, num_csx: int) -> tuple[RoleHost, JobSpec, Any, dict[int, list[bytes]]]:
    """A configured SwarmX root of a TINY job on the shared-memory plane whose pushes to MemoryX land in
    the returned lists (one per shard), and the model."""
    job = tiny_role_job(tmp_path, "swarmx", num_csx=num_csx)
    params = load_params(job.params)
    plan = make_plan(params)
    assert plan.num_wgt_servers == 2  # a unit's tensors may go to two shards
    host = RoleHost("swarmx", swarmx_service.build, "c" * 64)
    host.configure(job)
    received: dict[int, list[bytes]] = {s: [] for s in range(plan.num_wgt_servers)}

    def receiver(shard: int) -> Any:
        def push(messages: Any, timeout: float) -> pb.Ack:
            received[shard].extend(messages)
            return pb.Ack()

        return push

    push_through(host.logic(direct_context()).upstream, [receiver(s) for s in received])
    return host, job, model_def(params), received


def _worker_push(job: JobSpec, model: Any, arena: SharedArena, unit: int) -> tuple[list[bytes], dict]:
    """What a worker sends for ``unit``: every gradient copied into one memfd, the header alone on gRPC."""
    rng = np.random.default_rng(unit)
    grads = {
        n: rng.standard_normal(model.specs[n].shape).astype(np.float32) for n in model.units[unit].param_names
    }
    with arena.lease() as scratch:
        messages = list(tensor_messages(grads.items(), pb.StreamHead(step=3, unit=unit), shm=scratch))
        # the lease would close the memfd once the call returns: keep it open for the test
        scratch.bufs.clear()
    return messages, grads


def test_a_single_child_nodes_gradients_reach_memoryx_as_the_workers_own_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, job, model, received = _swarmx(tmp_path, num_csx=1)
    arena = SharedArena(arena_tag(job))
    plan = make_plan(load_params(job.params))
    # a unit whose tensors lie on both shards: each must get exactly its own
    unit = next(
        u for u, spec in enumerate(model.units) if len({plan.tensor_shard[n] for n in spec.param_names}) > 1
    )
    messages, grads = _worker_push(job, model, arena, unit)
    sent = references_only(messages)
    assert sent is not None
    where = {t.name: (t.shm_pid, t.shm_fd, t.offset, t.xxh3) for t in sent[1].tensors}

    def no_mapping(*args: Any) -> None:
        raise AssertionError("SwarmX mapped a gradient it only had to pass on")

    monkeypatch.setattr(tensors_module, "attach", no_mapping)
    servicer = swarmx_service.SwarmXServicer(host)
    servicer.PushGradients(iter(messages), direct_context())
    monkeypatch.undo()

    for shard, got in received.items():
        mine = sorted(n for n in grads if plan.tensor_shard[n] == shard)
        assert mine, "the unit was chosen to span both shards"
        relayed = references_only(got)
        assert relayed is not None
        head, header = relayed
        assert (head.step, head.unit) == (3, unit)
        assert sorted(t.name for t in header.tensors) == mine
        assert all((t.shm_pid, t.shm_fd, t.offset, t.xxh3) == where[t.name] for t in header.tensors)
        _, out = read_messages(got, shm_tag(job))  # what MemoryX reads: the worker's bytes, checked
        for n in mine:
            np.testing.assert_array_equal(out[n], grads[n])
            loc = locate(out[n])
            assert loc is not None and (loc.pid, loc.fd, loc.offset) == where[n][:3]
    host.close()
    arena.close()


def test_a_corrupt_gradient_passed_on_is_still_caught_at_memoryx(tmp_path: Path) -> None:
    host, job, model, received = _swarmx(tmp_path, num_csx=1)
    arena = SharedArena(arena_tag(job))
    messages, _ = _worker_push(job, model, arena, 1)
    sent = references_only(messages)
    assert sent is not None
    _, header = sent
    header.tensors[0].xxh3 ^= 1  # as if the bytes had changed on the way
    bad = [tensors_module.header_message(header)]
    swarmx_service.SwarmXServicer(host).PushGradients(iter(bad), direct_context())  # passed on unchecked
    got = [m for msgs in received.values() for m in msgs]
    with pytest.raises(ChecksumError, match=header.tensors[0].name):
        for m in got:
            read_messages([m], shm_tag(job))
    host.close()
    arena.close()


def test_a_node_with_two_children_still_sums_and_inline_bytes_are_still_read(tmp_path: Path) -> None:
    """Two children: each push is read and the sum goes up in SwarmX's own memfd. One child sending its
    bytes inline (the gRPC plane's form) is read and checked here as before."""
    host, job, model, received = _swarmx(tmp_path, num_csx=2)
    arena = SharedArena(arena_tag(job))
    servicer = swarmx_service.SwarmXServicer(host)
    name = model.units[1].param_names[0]
    g = {name: np.full(model.specs[name].shape, 0.5, np.float32)}
    for child in range(2):
        head = pb.StreamHead(step=0, unit=1, sender=child)
        with arena.lease() as scratch:
            msgs = list(tensor_messages(g.items(), head, shm=scratch if child == 0 else None))
            servicer.PushGradients(iter(msgs), direct_context())
    got = [m for msgs in received.values() for m in msgs]
    _, out = read_messages(got, shm_tag(job))
    np.testing.assert_array_equal(out[name], np.full(model.specs[name].shape, 1.0, np.float32))
    loc = locate(out[name])
    assert loc is not None
    host.close()
    arena.close()


def test_only_a_single_header_naming_shared_memory_is_passed_on_as_it_is() -> None:
    arena = SharedArena("t" * 24)
    a = np.arange(6, dtype=np.float32)
    with arena.lease() as scratch:
        shared = list(tensor_messages([("a", a)], pb.StreamHead(step=1, unit=2), shm=scratch))
    inline = list(tensor_messages([("a", a)], pb.StreamHead(step=1, unit=2)))
    assert references_only(shared) is not None
    assert references_only(inline) is None  # bytes in the stream: read and checked where they arrive
    assert references_only(shared * 2) is None
    sent = references_only(shared)
    assert sent is not None
    sent[1].total_bytes = 64  # a header announcing a payload it does not carry
    assert references_only([tensors_module.header_message(sent[1])]) is None
    sent[1].total_bytes = 0
    pid, sent[1].tensors[0].shm_pid = sent[1].tensors[0].shm_pid, 0  # bytes that lie nowhere
    assert references_only([tensors_module.header_message(sent[1])]) is None
    sent[1].tensors[0].shm_pid = pid
    headless = pb.TensorSetHeader(tensors=sent[1].tensors)
    with pytest.raises(ProtocolError, match="StreamHead"):
        references_only([tensors_module.header_message(headless)])
    arena.close()


def test_an_inner_node_passes_the_header_to_its_parent_as_its_own_child_slot() -> None:
    plane = SharedMemoryPlane("t" * 24)
    up = swarmx_service.ParentUpstream("127.0.0.1:1", 3, 5.0, False, "swarmx-0", "c" * 64, 0, plane)
    got: list[bytes] = []
    up.push = lambda messages, timeout: got.extend(messages)  # type: ignore[assignment]  # in place of the gRPC call
    arena = SharedArena("t" * 24)
    with arena.lease() as scratch:
        msgs = list(
            tensor_messages(
                [("w", np.ones(4, np.float32))], pb.StreamHead(step=2, unit=5, sender=0), shm=scratch
            )
        )
        sent = references_only(msgs)
        assert sent is not None
        up.relay_grads(2, 5, sent[1])
    relayed = references_only(got)
    assert relayed is not None
    head, header = relayed
    assert (head.step, head.unit, head.sender) == (2, 5, 3)
    assert list(header.tensors) == list(sent[1].tensors)
    arena.close()

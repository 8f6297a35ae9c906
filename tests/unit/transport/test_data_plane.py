"""The data plane (transport/plane.py, transport/peers.py): a pair of roles picks shared memory only on one
host whose memfds map, the network otherwise; both planes carry the same tensors bit for bit and check
every one end to end."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import weightstream.transport.peers as peers
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import ControlServicer, RoleHost
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.plane import (
    NETWORK,
    PLANE_METADATA,
    SHARED_MEMORY,
    DataPlane,
    NetworkPlane,
    SharedMemoryPlane,
    inline,
    plane_of_call,
)
from weightstream.transport.rpc import create_server
from weightstream.transport.shm import job_tag
from weightstream.transport.tensors import references_only, tensor_messages

TOKEN = "p" * 64
TAG = job_tag(TOKEN)


# -- the choice ---------------------------------------------------------------------------------------------
def test_same_host_whose_memfds_map_picks_shared_memory() -> None:
    choice = peers.choose("h1/boot/7", "h1/boot/7", lambda: True)
    assert choice.kind == SHARED_MEMORY and not choice.fallback


def test_another_host_picks_the_network_without_probing() -> None:
    def probe() -> bool:
        raise AssertionError("a peer on another host is not probed")

    choice = peers.choose("h1/boot/7", "h2/boot/9", probe)
    assert choice.kind == NETWORK and "another host" in choice.reason and not choice.fallback


def test_same_host_whose_memfds_do_not_map_falls_back_to_the_network() -> None:
    choice = peers.choose("h1/boot/7", "h1/boot/7", lambda: False)
    assert choice.kind == NETWORK and choice.fallback and "cannot be mapped" in choice.reason


def test_the_host_identity_names_the_pid_namespace_and_the_user() -> None:
    ident = peers.host_identity()
    assert ident.endswith(f"/{os.stat('/proc/self/ns/pid').st_ino}/{os.getuid()}")
    assert ident == peers.host_identity()


def test_a_probe_maps_only_with_the_jobs_tag_the_right_memfd_and_the_identity_it_holds() -> None:
    probe = peers.MemfdProbe(TAG, "h1/boot/7")
    try:
        assert peers.can_map(probe.pid, probe.fd, TAG, "h1/boot/7")
        assert not peers.can_map(probe.pid, probe.fd, job_tag("q" * 64), "h1/boot/7")  # another job
        assert not peers.can_map(probe.pid, probe.fd, TAG, "h2/boot/7")  # it says another identity
        assert not peers.can_map(probe.pid, 10_000, TAG, "h1/boot/7")  # no such fd
        assert not peers.can_map(0, probe.fd, TAG, "h1/boot/7")  # a peer with no probe
    finally:
        probe.close()


@pytest.fixture
def role() -> Iterator[tuple[str, RoleHost]]:
    """A role's Control service with its probe, listening on loopback."""
    host = RoleHost("memoryx", lambda job: None, TOKEN, probe=peers.MemfdProbe(TAG))
    server, port = create_server(
        "127.0.0.1:0", lambda s: rpc.add_ControlServicer_to_server(ControlServicer(host), s)
    )
    yield f"127.0.0.1:{port}", host
    server.stop(None)
    host.close()


def test_a_role_asks_its_peer_over_health_and_picks_shared_memory_on_this_host(
    role: tuple[str, RoleHost],
) -> None:
    address, _ = role
    shared = SharedMemoryPlane(TAG)
    assert peers.plane_for_peer("memoryx-0", address, TOKEN, TAG, lambda: shared) is shared
    # without the job's credential the peer says nothing of its host or its memory
    assert peers.ask_peer(address, "x" * 64).host == ""


def test_a_peer_on_another_host_gets_the_network_with_a_log_line(
    role: tuple[str, RoleHost], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    address, _ = role
    monkeypatch.setattr(peers, "host_identity", lambda: "elsewhere/boot/1")
    with caplog.at_level(logging.INFO, "weightstream.transport"):
        plane = peers.plane_for_peer("memoryx-0", address, TOKEN, TAG, lambda: pytest.fail("not shared"))
    assert plane.kind == NETWORK
    assert "data plane to memoryx-0" in caplog.text and "network, on another host" in caplog.text


def test_a_peer_whose_probe_does_not_map_gets_the_network_with_a_warning(
    role: tuple[str, RoleHost], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    address, _ = role
    monkeypatch.setattr(peers, "can_map", lambda *a: False)
    with caplog.at_level(logging.INFO, "weightstream.transport"):
        plane = peers.plane_for_peer("memoryx-0", address, TOKEN, TAG, lambda: pytest.fail("not shared"))
    assert plane.kind == NETWORK
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "cannot be mapped" in caplog.text


def test_a_job_on_the_network_asks_no_peer() -> None:
    plane = peers.plane_for_peer("memoryx-0", "127.0.0.1:1", TOKEN, None, lambda: pytest.fail("not shared"))
    assert plane.kind == NETWORK


def test_a_call_is_served_on_the_plane_its_caller_chose() -> None:
    shared = SharedMemoryPlane(TAG)
    assert plane_of_call([(PLANE_METADATA, SHARED_MEMORY)], shared) is shared
    assert plane_of_call([(PLANE_METADATA, NETWORK)], shared).kind == NETWORK
    assert plane_of_call([], shared).kind == NETWORK  # a caller that says nothing: the coordinator
    assert plane_of_call([(PLANE_METADATA, SHARED_MEMORY)], None).kind == NETWORK  # a job on the network


# -- what both planes share -------------------------------------------------------------------------------
def _plane(kind: str) -> DataPlane:
    return (
        SharedMemoryPlane(TAG, kept_bytes=1 << 20, kept_mappings=8)
        if kind == SHARED_MEMORY
        else NetworkPlane()
    )


def _pushed(plane: DataPlane, tensors: dict[str, np.ndarray], bf16: bool = False, tamper=None):
    """What the receiver reads of ``tensors`` pushed on ``plane`` (``tamper`` may alter the stream)."""
    got = []

    def send(messages: Iterator[bytes]) -> None:
        msgs = list(messages)
        if tamper is not None:
            msgs = tamper(msgs)
        got.append(plane.read(iter(msgs)))

    plane.push(send, tensors.items(), pb.StreamHead(step=3, unit=1, sender=2), bf16=bf16)
    return got[0]


@pytest.mark.parametrize("kind", [NETWORK, SHARED_MEMORY])
@pytest.mark.parametrize("sizes", [[0], [1], [63, 64, 65], [5 << 20, 3]])
def test_both_planes_carry_tensors_bit_for_bit(kind: str, sizes: list[int], rng) -> None:
    plane = _plane(kind)
    tensors = {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}
    tensors["ids"] = rng.integers(0, 50000, (3, 7))
    head, out = _pushed(plane, tensors)
    assert head is not None and (head.step, head.unit, head.sender) == (3, 1, 2)
    assert list(out) == list(tensors)
    for name, arr in tensors.items():
        assert out[name].dtype == arr.dtype
        assert_array_equal(out[name], arr)
    plane.close()


@pytest.mark.parametrize("kind", [NETWORK, SHARED_MEMORY])
def test_both_planes_carry_bfloat16_the_same(kind: str, rng) -> None:
    x = rng.standard_normal(1000).astype(np.float32)
    _, net = _pushed(NetworkPlane(), {"x": x}, bf16=True)
    _, out = _pushed(_plane(kind), {"x": x}, bf16=True)
    assert_array_equal(out["x"], net["x"])


def _flip_last_byte_in_flight(msgs: list[bytes]) -> list[bytes]:
    """Corrupt one byte of the tensor: in the last message's payload, or in the memfd the header names."""
    relayed = references_only(msgs)
    if relayed is None:
        last = bytearray(msgs[-1])
        last[-1] ^= 1
        return [*msgs[:-1], bytes(last)]
    t = relayed[1].tensors[0]
    fd = os.open(f"/proc/{t.shm_pid}/fd/{t.shm_fd}", os.O_RDWR)
    try:
        byte = os.pread(fd, 1, t.offset)
        os.pwrite(fd, bytes([byte[0] ^ 1]), t.offset)
    finally:
        os.close(fd)
    return msgs


@pytest.mark.parametrize("kind", [NETWORK, SHARED_MEMORY])
def test_both_planes_check_every_tensor_end_to_end(kind: str, rng) -> None:
    with pytest.raises(ChecksumError, match="checksum"):
        _pushed(
            _plane(kind), {"w": rng.standard_normal(64).astype(np.float32)}, tamper=_flip_last_byte_in_flight
        )


def test_the_network_plane_refuses_a_stream_that_names_shared_memory(rng) -> None:
    """A receiver on the network plane (a role on another host) cannot map the sender's memfds: a stream
    naming them is an error, never silently wrong tensors."""
    w = rng.standard_normal(8).astype(np.float32)
    with pytest.raises(ProtocolError, match="shared memory, which this stream may not use"):
        SharedMemoryPlane(TAG).push(NetworkPlane().read, [("w", w)], pb.StreamHead(), bf16=False)


def test_a_relay_sends_shared_memory_on_inline_for_a_peer_on_the_network(rng) -> None:
    """What a SwarmX node does for a child on another host with MemoryX on its own: the bytes leave the
    memfds and travel in the stream, which the network plane reads."""
    shared = SharedMemoryPlane(TAG)
    w = {"w": rng.standard_normal(300).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    sent: list[bytes] = []

    def send(messages: Iterator[bytes]) -> None:
        msgs = list(messages)
        assert references_only(msgs) is not None  # the header alone on shared memory
        sent.extend(inline(iter(msgs), shared, bf16=False))

    shared.push(send, w.items(), pb.StreamHead(step=1, unit=0), bf16=False)
    assert references_only(sent) is None and sum(map(len, sent)) > w["w"].nbytes  # the bytes, inline
    head, out = NetworkPlane().read(iter(sent))
    assert head is not None and head.step == 1
    for name, arr in w.items():
        assert_array_equal(out[name], arr)


def test_a_relay_passes_inline_bytes_on_as_they_came_and_converts_only_shared_memory(rng) -> None:
    """A stream of two segments, one in shared memory (a shard on this host) and one inline (a shard on
    another): the inline segment's messages go on untouched, the other is made inline."""
    shared = SharedMemoryPlane(TAG)
    a = rng.standard_normal(64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    with shared.arena.lease() as scratch:
        by_reference = list(tensor_messages([("a", a)], shm=scratch))
        in_stream = list(tensor_messages([("b", b)]))
        out = list(inline(iter(by_reference + in_stream), shared, bf16=False))
        # the very messages that came (no decoding, no copy), and a new one for the shared segment
        assert all(x is y for x, y in zip(out[-len(in_stream) :], in_stream, strict=True))
        assert out[0] != by_reference[0]
        _, got = NetworkPlane().read(iter(out))
    assert_array_equal(got["a"], a)
    assert_array_equal(got["b"], b)

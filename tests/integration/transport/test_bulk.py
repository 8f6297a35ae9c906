"""Bulk transfers on loopback: the network plane's payload fetched over TCP beside gRPC, checked end to
end, served only to the job's credential, let go when done, cut-through at a relay, inline when full."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport import bulk
from weightstream.transport.errors import ChecksumError, PeerError, ProtocolError
from weightstream.transport.plane import NetworkPlane, relay
from weightstream.transport.tensors import bf16_to_f32, bulk_header, checksum, f32_to_bf16, header_message

TOKEN = "b" * 64
HOST = "127.0.0.1"


@pytest.fixture
def endpoint() -> Iterator[bulk.BulkEndpoint]:
    end = bulk.start(HOST, TOKEN)
    try:
        yield end
    finally:
        bulk.stop()


def _tensors() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    # sizes that need padding to the 64-byte alignment, an empty one, and one of several MiB
    return [
        ("a", rng.standard_normal((3, 5)).astype(np.float32)),
        ("empty", np.zeros((0,), np.float32)),
        ("b", rng.standard_normal(1 << 20).astype(np.float32)),
        ("ids", np.arange(7, dtype=np.int64)),
    ]


def test_a_stream_is_one_header_naming_a_transfer_and_reads_back_bitwise(endpoint: bulk.BulkEndpoint) -> None:
    tensors = _tensors()
    messages = list(NetworkPlane().stream(tensors, bf16=False))
    assert len(messages) == 1 and len(messages[0]) < 4096  # the header alone: the payload waits to be fetched
    header = bulk_header(messages[0])
    assert header is not None and header.bulk_port == endpoint.port and len(header.bulk_id) == 16
    assert len(endpoint.outbox) == 1
    _, got = NetworkPlane().read(messages, peer=HOST)
    for name, arr in tensors:
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape
        np.testing.assert_array_equal(got[name], arr)
    assert len(endpoint.outbox) == 0  # fetched by its one reader: let go


def test_bfloat16_travels_as_half_the_bytes_and_reads_back_rounded(endpoint: bulk.BulkEndpoint) -> None:
    w = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    messages = list(NetworkPlane().stream([("w", w)], bf16=True))
    header = bulk_header(messages[0])
    assert header is not None and header.tensors[0].dtype == "bfloat16" and header.tensors[0].nbytes == 2000
    _, got = NetworkPlane().read(messages, peer=HOST)
    np.testing.assert_array_equal(got["w"], bf16_to_f32(f32_to_bf16(w)))


def test_every_tensor_is_checked_against_its_checksum_after_the_fetch(endpoint: bulk.BulkEndpoint) -> None:
    w = np.ones(4096, np.float32)
    messages = list(NetworkPlane().stream([("w", w)], bf16=False))
    w[17] = 2.0  # the sender's bytes change after the header was made: what arrives is not what was meant
    with pytest.raises(ChecksumError, match="'w'"):
        NetworkPlane().read(messages, peer=HOST)


def test_a_transfer_is_fetched_once_then_refused_by_name(endpoint: bulk.BulkEndpoint) -> None:
    messages = list(NetworkPlane().stream([("w", np.ones(64, np.float32))], bf16=False))
    NetworkPlane().read(messages, peer=HOST)
    header = bulk_header(messages[0])
    assert header is not None
    with pytest.raises(ProtocolError, match=f"{header.bulk_id.hex()} is not held at {HOST}:{endpoint.port}"):
        NetworkPlane().read(messages, peer=HOST)


def test_a_reader_without_the_jobs_credential_gets_no_byte_and_takes_nothing(
    endpoint: bulk.BulkEndpoint,
) -> None:
    messages = list(NetworkPlane().stream([("w", np.ones(64, np.float32))], bf16=False))
    header = bulk_header(messages[0])
    assert header is not None
    with pytest.raises(PeerError, match="bulk"):
        bulk.BulkFetcher("c" * 64).fetch(HOST, endpoint.port, header.bulk_id, memoryview(bytearray(256)), 10)
    with socket.create_connection((HOST, endpoint.port), timeout=10) as raw:
        raw.sendall(bulk.MAGIC + b"c" * 64 + header.bulk_id)
        assert raw.recv(1) == b""  # closed, no byte sent
    assert len(endpoint.outbox) == 1  # still there for the real reader
    _, got = NetworkPlane().read(messages, peer=HOST)
    assert got["w"].sum() == 64


def test_a_push_lets_its_payload_go_when_the_call_returns_or_fails(endpoint: bulk.BulkEndpoint) -> None:
    seen: list[np.ndarray] = []

    def send(messages: Iterator[bytes]) -> None:
        seen.append(NetworkPlane().read(messages, peer=HOST)[1]["g"])

    g = np.arange(100, dtype=np.float32)
    NetworkPlane().push(send, [("g", g)], pb.StreamHead(step=1, unit=2), bf16=False)
    np.testing.assert_array_equal(seen[0], g)
    assert len(endpoint.outbox) == 0

    def fail(messages: Iterator[bytes]) -> None:
        list(messages)
        raise RuntimeError("the receiver is gone")

    with pytest.raises(RuntimeError):
        NetworkPlane().push(fail, [("g", g)], pb.StreamHead(step=1, unit=2), bf16=False)
    assert len(endpoint.outbox) == 0  # never fetched, let go all the same


def test_a_full_outbox_sends_inline_and_the_stream_reads_the_same() -> None:
    end = bulk.start(HOST, TOKEN, max_entries=0)
    try:
        tensors = _tensors()
        messages = list(NetworkPlane().stream(tensors, bf16=False))
        assert bulk_header(messages[0]) is None and sum(len(m) for m in messages) > (4 << 20)
        _, got = NetworkPlane().read(messages)  # no peer needed: every byte is in the stream
        for name, arr in tensors:
            np.testing.assert_array_equal(got[name], arr)
        assert len(end.outbox) == 0
    finally:
        bulk.stop()


def test_without_an_endpoint_every_byte_is_inline_and_a_named_transfer_is_refused(
    endpoint: bulk.BulkEndpoint,
) -> None:
    named = list(NetworkPlane().stream([("w", np.ones(64, np.float32))], bf16=False))
    bulk.stop()
    inline = list(NetworkPlane().stream([("w", np.ones(64, np.float32))], bf16=False))
    assert bulk_header(inline[0]) is None
    assert NetworkPlane().read(inline)[1]["w"].sum() == 64
    with pytest.raises(ProtocolError, match="cannot fetch"):
        NetworkPlane().read(named, peer=HOST)


def _raw_fetch(port: int, key: bytes) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.sendall(bulk.MAGIC + TOKEN.encode() + key)
    return sock


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += got
    return out


def test_a_filling_transfer_is_served_as_it_arrives(endpoint: bulk.BulkEndpoint) -> None:
    parked = endpoint.outbox.filling(3 << 20, readers=1)
    assert parked is not None
    key, filling = parked
    filling.buf[:] = np.arange(3 << 20, dtype=np.int64).astype(np.uint8)
    with _raw_fetch(endpoint.port, key) as sock:
        assert struct.unpack("<Q", _recv(sock, 8))[0] == 3 << 20
        filling.advance(1 << 20)
        # the first MiB comes while the rest has not arrived: cut-through, not store-and-forward
        assert _recv(sock, 1 << 20) == filling.buf[: 1 << 20].tobytes()
        filling.advance(2 << 20)
        assert _recv(sock, 2 << 20) == filling.buf[1 << 20 :].tobytes()


def test_a_failed_fill_fails_its_readers_instead_of_handing_them_a_torn_payload(
    endpoint: bulk.BulkEndpoint,
) -> None:
    parked = endpoint.outbox.filling(2 << 20, readers=1)
    assert parked is not None
    key, filling = parked
    out = memoryview(bytearray(2 << 20))
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            bulk.BulkFetcher(TOKEN).fetch(HOST, endpoint.port, key, out, 10)
        except BaseException as e:
            errors.append(e)

    reader = threading.Thread(target=fetch)
    reader.start()
    filling.advance(1 << 20)
    filling.fail("upstream gone")
    reader.join(timeout=10)
    assert not reader.is_alive() and len(errors) == 1 and isinstance(errors[0], PeerError)


def test_a_relay_serves_its_own_transfer_to_each_reader_while_it_arrives(endpoint: bulk.BulkEndpoint) -> None:
    tensors = _tensors()
    upstream = NetworkPlane().stream(tensors, bf16=False)
    relayed = relay(upstream, HOST, readers=2)
    first = next(relayed)  # the header goes down before the payload is in
    own = bulk_header(first)
    assert own is not None and own.bulk_port == endpoint.port
    results: list[dict[str, np.ndarray]] = []
    readers = [
        threading.Thread(target=lambda: results.append(NetworkPlane().read([first], peer=HOST)[1]))
        for _ in range(2)
    ]
    for r in readers:
        r.start()
    assert list(relayed) == []  # the relay fills its transfer from upstream while the readers take it
    for r in readers:
        r.join(timeout=30)
    assert len(results) == 2
    for got in results:
        for name, arr in tensors:
            np.testing.assert_array_equal(got[name], arr)
    assert len(endpoint.outbox) == 0  # upstream's transfer fetched once, the relay's by both readers


def test_a_relay_passes_on_each_piece_before_the_rest_has_reached_it(endpoint: bulk.BulkEndpoint) -> None:
    """Cut-through across a relay: its reader gets the first MiB while the relay's upstream still has not
    sent the rest (a store-and-forward relay would hold the header, or the bytes, until all had come)."""
    total = 3 << 20
    parked = endpoint.outbox.filling(total, readers=1)  # the upstream's transfer, filled by hand
    assert parked is not None
    key, upstream = parked
    upstream.buf[:] = np.random.default_rng(5).integers(0, 256, total, dtype=np.uint8)
    header = pb.TensorSetHeader(total_bytes=total, bulk_port=endpoint.port, bulk_id=key)
    header.tensors.add(
        name="w", dtype="uint8", shape=[total], offset=0, nbytes=total, xxh3=checksum(upstream.buf)
    )
    relayed = relay(iter([header_message(header)]), HOST, readers=1)
    own = bulk_header(next(relayed))  # the header comes down before any byte has
    assert own is not None and own.bulk_id != key
    filler = threading.Thread(target=lambda: list(relayed))  # the relay fetching from its upstream
    filler.start()
    try:
        with _raw_fetch(endpoint.port, own.bulk_id) as sock:
            assert struct.unpack("<Q", _recv(sock, 8))[0] == total
            upstream.advance(1 << 20)
            assert _recv(sock, 1 << 20) == upstream.buf[: 1 << 20].tobytes()
            upstream.advance(2 << 20)
            assert _recv(sock, 2 << 20) == upstream.buf[1 << 20 :].tobytes()
    finally:
        upstream.advance(total - upstream.filled)  # whatever happened, the relay's fetch ends
        filler.join(timeout=30)
    assert not filler.is_alive()


def test_a_fetcher_keeps_a_bounded_number_of_connections_the_most_recent_peers_first(
    endpoint: bulk.BulkEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "MAX_IDLE", 2)
    others = [bulk.BulkServer(HOST, TOKEN, bulk.Outbox()) for _ in range(3)]
    fetcher = bulk.BulkFetcher(TOKEN)
    try:
        for server in [*others, others[0]]:  # the first peer again: now the most recent
            key = server.outbox.offer([memoryview(b"abc")])
            assert key is not None
            fetcher.fetch(HOST, server.port, key, memoryview(bytearray(3)), 10)
        kept = fetcher._idle
        assert sum(len(v) for v in kept.values()) == 2
        assert list(kept) == [(HOST, others[2].port), (HOST, others[0].port)]
    finally:
        fetcher.close()
        for server in others:
            server.close()


def test_a_relay_with_a_full_outbox_passes_the_segment_on_inline() -> None:
    end = bulk.start(HOST, TOKEN, max_entries=1)  # room for the upstream's transfer, none for the relay's
    try:
        tensors = _tensors()
        upstream = list(NetworkPlane().stream(tensors, bf16=False))
        assert bulk_header(upstream[0]) is not None
        relayed = list(relay(iter(upstream), HOST, readers=2))
        assert bulk_header(relayed[0]) is None and sum(len(m) for m in relayed) > (4 << 20)
        _, got = NetworkPlane().read(relayed)  # every byte in the stream: nothing to fetch
        for name, arr in tensors:
            np.testing.assert_array_equal(got[name], arr)
        assert len(end.outbox) == 0
    finally:
        bulk.stop()


def test_a_kept_connection_to_a_server_since_replaced_is_retried_once_on_a_new_one() -> None:
    """A role replaced at the same port (a Kubernetes pod keeps its) leaves the fetcher a kept connection
    to a server that is gone: the fetch goes through on a fresh one."""
    fetcher, port = bulk.BulkFetcher(TOKEN), 0
    try:
        for _ in range(2):  # the second server on the first one's port, once that one is closed
            server = bulk.BulkServer(HOST, TOKEN, bulk.Outbox(), port)
            port = server.port
            try:
                key = server.outbox.offer([memoryview(b"xyz")])
                assert key is not None
                out = bytearray(3)
                fetcher.fetch(HOST, port, key, memoryview(out), 10)
                assert out == b"xyz"
            finally:
                server.close()
    finally:
        fetcher.close()

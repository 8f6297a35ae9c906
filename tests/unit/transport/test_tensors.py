"""Tensor frames: exact round trips at every size around the chunk boundary, checksums, bfloat16."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from numpy.testing import assert_array_equal

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport import tensors as T
from weightstream.transport.errors import ChecksumError, ProtocolError


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(T, "CHUNK_BYTES", 256)  # many frames from small tensors
    return 256


@pytest.mark.parametrize("sizes", [[0], [1], [63], [64], [65], [255, 1], [256], [257, 3, 1000], [5] * 40])
def test_round_trip_is_exact_across_chunk_boundaries(sizes: list[int], small_chunks: int, rng) -> None:
    tensors = [(f"t{i}", rng.standard_normal(n).astype(np.float32)) for i, n in enumerate(sizes)]
    tensors.append(("ids", rng.integers(0, 50000, (3, 7))))
    msgs = list(T.tensor_messages(tensors, pb.StreamHead(step=4, unit=2, phase=1, sender=3)))
    assert all(len(m) <= small_chunks + 4 + 4096 for m in msgs)
    head, out = T.read_messages(iter(msgs))
    assert head is not None and (head.step, head.unit, head.phase, head.sender) == (4, 2, 1, 3)
    assert list(out) == [n for n, _ in tensors]  # order kept
    for name, arr in tensors:
        assert out[name].dtype == arr.dtype and out[name].shape == arr.shape
        assert_array_equal(out[name], arr)
        assert arr.size == 0 or out[name].ctypes.data % 64 == 0  # aligned views into one buffer


def test_small_tensors_share_one_message(rng) -> None:
    tensors = [(f"b{i}", rng.standard_normal(100).astype(np.float32)) for i in range(12)]
    assert len(list(T.tensor_messages(tensors))) == 1


def test_corruption_is_detected(rng) -> None:
    [msg] = list(T.tensor_messages([("w", rng.standard_normal(1000).astype(np.float32))]))
    data = bytearray(msg)
    data[-100] ^= 0x01  # a payload byte
    with pytest.raises(ChecksumError, match="'w'"):
        T.read_messages([bytes(data)])


def test_the_header_carries_each_tensors_xxh3_64_of_the_bytes_as_sent(rng) -> None:
    """The wire format: ``TensorHeader.xxh3`` is XXH3-64 (seed 0) of the tensor's bytes on the wire (as
    bfloat16 where they travel so), what any reader of the format checks; a single flipped bit anywhere
    in a 1 MiB tensor changes it."""
    x = rng.standard_normal(1 << 18).astype(np.float32)
    for bf16, wire in ((False, x), (True, T.f32_to_bf16(x))):
        first = next(iter(T.tensor_messages([("x", x)], bf16=bf16)))  # the header, then payload
        (n,) = T._LEN.unpack_from(first)
        sent = pb.TensorSetHeader.FromString(first[4 : 4 + n]).tensors[0]
        assert sent.xxh3 == xxhash.xxh3_64_intdigest(wire.tobytes())
    flipped = x.copy()
    for pos in (0, flipped.nbytes // 2, flipped.nbytes - 1):
        flipped.view(np.uint8)[pos] ^= 0x80
        assert T.checksum(flipped.view(np.uint8)) != T.checksum(x.view(np.uint8))
        flipped.view(np.uint8)[pos] ^= 0x80


def test_truncated_and_malformed_streams_are_rejected(small_chunks: int, rng) -> None:
    msgs = list(T.tensor_messages([("w", rng.standard_normal(500).astype(np.float32))]))
    assert len(msgs) > 2
    with pytest.raises(ProtocolError, match="ended after"):
        T.read_messages(msgs[:-1])
    with pytest.raises(ProtocolError, match="empty"):
        T.read_messages([])
    with pytest.raises(ProtocolError, match="before any header"):
        T.read_messages(msgs[1:])
    with pytest.raises(ProtocolError, match="more than"):
        T.read_messages([*msgs, msgs[-1]])
    with pytest.raises(ProtocolError, match="cannot be sent"):
        list(T.tensor_messages([("c", np.zeros(3, dtype=np.complex64))]))


def test_segments_concatenate(rng) -> None:
    """A relay may join the streams of two shards: the reader takes every segment, in order."""
    a = [("a", rng.standard_normal(10).astype(np.float32))]
    b = [("b", rng.integers(0, 9, 4)), ("c", np.zeros(0, np.float32))]
    head, out = T.read_messages([*T.tensor_messages(a, pb.StreamHead(step=2)), *T.tensor_messages(b)])
    assert head is not None and head.step == 2 and list(out) == ["a", "b", "c"]
    assert_array_equal(out["a"], a[0][1])
    assert_array_equal(out["b"], b[0][1])


def test_known_checksums_are_trusted_only_for_unconverted_tensors(rng) -> None:
    x = rng.standard_normal(100).astype(np.float32)
    [msg] = list(T.tensor_messages([("x", x)], checksums={"x": 12345}))
    with pytest.raises(ChecksumError):  # a wrong cached checksum is caught by the receiver
        T.read_messages([msg])
    [msg] = list(T.tensor_messages([("x", x)], bf16=True, checksums={"x": 12345}))
    assert T.read_messages([msg])[1]["x"].dtype == np.float32  # converted: its own checksum is computed


def test_bfloat16_on_the_wire(rng) -> None:
    x = rng.standard_normal(4099).astype(np.float32) * 10
    x[:4] = [0.0, -0.0, np.inf, np.nan]
    msgs = list(T.tensor_messages([("w", x), ("ids", np.arange(5))], bf16=True))
    _, out = T.read_messages(msgs)
    y = out["w"]
    assert y.dtype == np.float32 and np.isnan(y[3]) and y[2] == np.inf
    finite = np.isfinite(x)
    assert np.all(np.abs(y[finite] - x[finite]) <= np.abs(x[finite]) * 2**-8)  # 8 significant bits
    assert_array_equal(T.bf16_to_f32(T.f32_to_bf16(y)), y)  # bf16 values survive another hop exactly
    assert_array_equal(out["ids"], np.arange(5))


def test_bfloat16_rounds_to_nearest_even() -> None:
    one_plus_half_ulp = np.array([1.0 + 2**-8], dtype=np.float32)  # exactly between two bf16 values
    assert T.bf16_to_f32(T.f32_to_bf16(one_plus_half_ulp))[0] == 1.0  # ties go to the even mantissa
    above = np.array([1.0 + 2**-8 + 2**-20], dtype=np.float32)
    assert T.bf16_to_f32(T.f32_to_bf16(above))[0] == 1.0 + 2**-7

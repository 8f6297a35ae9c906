"""A sparse tensor on the wire: index codes round-trip exactly, the smaller one is chosen, broken or
hostile indexes are refused by name, and the checksums cover the compressed bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.sparse import decode_index, encode_index, index_name, split_index
from weightstream.transport.tensors import f32_to_bf16, read_messages, tensor_messages, wire_nbytes


@pytest.mark.parametrize(
    "numel,density", [(10_000, 0.5), (10_000, 0.1), (100_000, 0.05), (7, 1.0), (1000, 0.0)]
)
def test_index_round_trips_and_is_the_smaller_code(rng, numel: int, density: float) -> None:
    positions = np.sort(rng.permutation(numel)[: round(density * numel)]).astype(np.int64)
    kind, data = encode_index(positions, numel)
    assert data.dtype == np.uint8
    assert np.array_equal(decode_index("w", kind, data, numel, len(positions)), positions)
    bitmask_bytes = -(-numel // 8)
    assert len(data) <= bitmask_bytes  # never more than one bit per entry
    assert kind == ("delta" if len(positions) < bitmask_bytes else "bitmask")


def test_delta_code_spans_gaps_longer_than_a_byte() -> None:
    positions = np.array([0, 254, 255, 510, 511, 2000, 99_999], dtype=np.int64)
    kind, data = encode_index(positions, 100_000)
    assert kind == "delta" and (data == 0).sum() == 5 + 384  # filler bytes of the gaps 1489 and 97999
    assert np.array_equal(decode_index("w", kind, data, 100_000, len(positions)), positions)


@pytest.mark.parametrize(
    "kind,data,count,message",
    [
        ("bitmask", np.zeros(3, np.uint8), 0, "bitmask of 3 bytes"),
        ("bitmask", np.array([0, 0x80], np.uint8), 1, "past the tensor"),  # entry 15 of 10
        ("delta", np.array([5, 0], np.uint8), 1, "filler"),
        ("delta", np.array([5, 6], np.uint8), 2, "past the tensor"),  # positions 4, 10 of 10
        ("delta", np.array([1, 1], np.uint8), 3, "3 values came"),
        ("runs", np.array([1], np.uint8), 1, "unknown"),
    ],
)
def test_broken_or_hostile_indexes_are_refused_by_name(
    kind: str, data: np.ndarray, count: int, message: str
) -> None:
    with pytest.raises(ProtocolError, match=rf"layer\.w.*{message}|{message}"):
        decode_index("layer.w", kind, data, 10, count)


def test_values_and_index_travel_bit_exactly_and_their_checksums_cover_the_compressed_bytes(rng) -> None:
    numel = 4096
    positions = np.sort(rng.permutation(numel)[:300]).astype(np.int64)
    values = rng.standard_normal(300).astype(np.float32)
    kind, data = encode_index(positions, numel)
    sent = [("w", values), (index_name("w", kind), data), ("b", rng.standard_normal(5).astype(np.float32))]
    messages = list(tensor_messages(sent))
    assert sum(len(m) for m in messages) < 300 * 4 + len(data) + 1024  # values + index + header, no dense
    _, got = read_messages(messages)
    plain, indexes = split_index(got)
    assert set(plain) == {"w", "b"} and indexes["w"][0] == kind
    assert plain["w"].tobytes() == values.tobytes()
    assert np.array_equal(decode_index("w", kind, indexes["w"][1], numel, 300), positions)
    _, got16 = read_messages(tensor_messages(sent, bf16=True))  # values as bfloat16, the index as bytes
    assert np.array_equal(got16["w"].view(np.uint32) >> 16, f32_to_bf16(values))
    assert np.array_equal(got16[index_name("w", kind)], data)
    for target in (values.tobytes()[:8], data.tobytes()[:8]):  # flip a bit of the values, then of the index
        broken = bytearray(b"".join(messages))
        at = broken.index(target)
        broken[at] ^= 1
        with pytest.raises(ChecksumError):
            read_messages([bytes(broken)])


def test_an_index_without_values_is_refused() -> None:
    with pytest.raises(ProtocolError, match="without values"):
        split_index({index_name("w", "delta"): np.ones(3, np.uint8)})


@pytest.mark.parametrize("bf16", [False, True])
def test_wire_nbytes_is_what_a_stream_carries(rng, bf16: bool) -> None:
    """The workers' worker_wire_bytes count: float32 as bfloat16 in a bf16 job, an index as its bytes."""
    sent = [("w", rng.standard_normal(300).astype(np.float32)), ("w::delta", np.ones(37, np.uint8))]
    first = next(iter(tensor_messages(sent, bf16=bf16)))
    (n,) = struct.unpack_from("<I", first)
    header = pb.TensorSetHeader.FromString(first[4 : 4 + n])
    assert [h.nbytes for h in header.tensors] == [wire_nbytes(a, bf16) for _, a in sent]
    assert header.tensors[0].nbytes == (600 if bf16 else 1200)

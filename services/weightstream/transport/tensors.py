"""Tensor streams: raw-bytes gRPC messages carrying a header and the tensors' bytes (layout in the proto).

Why raw bytes and not a protobuf ``bytes`` field: protobuf would copy the payload when the message is
built, serialised, parsed and read, single-threaded, per hop. Here the sender makes one copy (joining a
message's pieces) and the receiver one (into an aligned buffer); a relay (SwarmX) forwards the very bytes
it received. The receiver checks every tensor's crc32, end to end.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError

__all__ = [
    "CHUNK_BYTES",
    "NamedTensor",
    "bf16_to_f32",
    "f32_to_bf16",
    "read_messages",
    "tensor_messages",
]

# 4 MiB: large enough that per-message overhead is small, far below gRPC's message limit, and small
# enough that the receiver copies one message while the sender prepares the next.
CHUNK_BYTES = 4 << 20
_ALIGN = 64  # every tensor starts on a cache line, so the receiver's views are aligned for numpy
_LEN = struct.Struct("<I")
NamedTensor = tuple[str, np.ndarray]
_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "int64": np.int64, "uint16": np.uint16}


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    out = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(
        np.uint16
    )
    nan = np.isnan(x)
    if nan.any():
        out[nan.reshape(out.shape)] = 0x7FC0
    return out


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _pad(n: int) -> int:
    return -n % _ALIGN


def tensor_messages(
    tensors: Iterable[NamedTensor],
    head: pb.StreamHead | None = None,
    bf16: bool = False,
    crcs: Mapping[str, int] | None = None,
) -> Iterator[bytes]:
    """One segment holding ``tensors``, as gRPC messages. With ``bf16``, float32 travels as bfloat16.
    ``crcs`` may give known checksums of float32 tensors sent as they are (MemoryX caches them)."""
    header = pb.TensorSetHeader(head=head)
    views = []
    offset = 0
    for name, arr in tensors:
        if bf16 and arr.dtype == np.float32:
            wire, dtype = f32_to_bf16(arr), "bfloat16"
        else:
            wire, dtype = np.ascontiguousarray(arr), arr.dtype.name
            if dtype not in _DTYPES:
                raise ProtocolError(f"tensor {name!r}: dtype {dtype} cannot be sent")
        view = memoryview(wire.reshape(-1).view(np.uint8))
        known = crcs.get(name) if crcs is not None and dtype == arr.dtype.name else None
        crc = known if known is not None else zlib.crc32(view)
        header.tensors.add(
            name=name, dtype=dtype, shape=arr.shape, offset=offset, nbytes=view.nbytes, crc32=crc
        )
        views.append(view)
        offset += view.nbytes + _pad(view.nbytes)
    header.total_bytes = offset
    head_bytes = header.SerializeToString()
    first = True
    for parts in _payload_chunks(views):
        prefix = [_LEN.pack(len(head_bytes)), head_bytes] if first else [_LEN.pack(0)]
        yield b"".join([*prefix, *parts])
        first = False
    if first:  # no payload at all: the header alone
        yield _LEN.pack(len(head_bytes)) + head_bytes


def _payload_chunks(views: list[memoryview]) -> Iterator[list[memoryview | bytes]]:
    """The payload (tensors back to back, each padded to the alignment) as pieces of CHUNK_BYTES."""
    parts: list[memoryview | bytes] = []
    size = 0
    for view in views:
        for piece in (view, bytes(_pad(view.nbytes))):
            pos = 0
            while pos < len(piece):
                take = min(CHUNK_BYTES - size, len(piece) - pos)
                parts.append(piece[pos : pos + take])
                size, pos = size + take, pos + take
                if size == CHUNK_BYTES:
                    yield parts
                    parts, size = [], 0
    if parts:
        yield parts


class _Segment:
    def __init__(self, header: pb.TensorSetHeader) -> None:
        self.header = header
        raw = np.empty(header.total_bytes + _ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % _ALIGN
        self.buf = raw[start : start + header.total_bytes]  # aligned, so every tensor's view is too
        self.filled = 0

    def add(self, data: memoryview) -> None:
        n = len(data)
        if self.filled + n > self.header.total_bytes:
            raise ProtocolError(f"segment carries more than the announced {self.header.total_bytes} bytes")
        self.buf[self.filled : self.filled + n] = np.frombuffer(data, dtype=np.uint8)
        self.filled += n

    def tensors(self, out: dict[str, np.ndarray]) -> None:
        if self.filled != self.header.total_bytes:
            raise ProtocolError(f"segment ended after {self.filled} of {self.header.total_bytes} bytes")
        for h in self.header.tensors:
            if h.dtype not in _DTYPES:
                raise ProtocolError(f"tensor {h.name!r}: unknown wire dtype {h.dtype!r}")
            raw = self.buf[h.offset : h.offset + h.nbytes]
            if len(raw) != h.nbytes:
                raise ProtocolError(f"tensor {h.name!r}: extends past the payload")
            if zlib.crc32(raw) != h.crc32:
                raise ChecksumError(f"tensor {h.name!r}: crc32 mismatch ({h.nbytes} bytes)")
            arr = raw.view(_DTYPES[h.dtype]).reshape(tuple(h.shape))
            out[h.name] = bf16_to_f32(arr) if h.dtype == "bfloat16" else arr


def read_messages(messages: Iterable[bytes]) -> tuple[pb.StreamHead | None, dict[str, np.ndarray]]:
    """Assemble a tensor stream (one or more segments) into (head or None, {name: array}), checking
    every checksum. Arrays are views into one aligned buffer per segment."""
    head: pb.StreamHead | None = None
    out: dict[str, np.ndarray] = {}
    seg: _Segment | None = None
    for msg in messages:
        view = memoryview(msg)
        if len(view) < _LEN.size:
            raise ProtocolError("truncated message")
        (n,) = _LEN.unpack_from(view)
        if n:
            if seg is not None:
                seg.tensors(out)
            header = pb.TensorSetHeader.FromString(view[_LEN.size : _LEN.size + n])
            if head is None and header.HasField("head"):
                head = header.head
            seg = _Segment(header)
        elif seg is None:
            raise ProtocolError("payload before any header")
        seg.add(view[_LEN.size + n :])
    if seg is None:
        raise ProtocolError("empty tensor stream")
    seg.tensors(out)
    return head, out

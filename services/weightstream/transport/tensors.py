"""Tensor streams: raw-bytes gRPC messages carrying a header and the tensors' bytes (layout in the proto).

Why raw bytes and not a protobuf ``bytes`` field: protobuf would copy the payload when the message is
built, serialised, parsed and read, single-threaded, per hop. Here the sender makes one copy (joining a
message's pieces) and the receiver one (into an aligned buffer); a relay (SwarmX) forwards the very bytes
it received. The receiver checks every tensor's checksum, end to end: XXH3-64 (the ``xxhash`` package,
SIMD; 40 GB/s from memory on an AMD EPYC here against hardware CRC-32C's 18 and zlib.crc32's ~2.3), so a
check costs a fraction of a copy. Every tensor is checked twice a step per hop (forward and backward),
shared memory included, which made the checksum ~15 core-ms of a d512/L4 step with CRC-32C.

Between co-located roles (``shm``: see transport/shm.py) a tensor already in a memfd travels by reference
and any other is copied once into a memfd; only the header goes over gRPC.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

import numpy as np
import xxhash

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.shm import attach, locate
from weightstream.transport.shm_cache import MappingCache

__all__ = [
    "CHUNK_BYTES",
    "Fetch",
    "NamedTensor",
    "Park",
    "Scratch",
    "as_bf16",
    "bf16_to_f32",
    "bulk_header",
    "checksum",
    "f32_to_bf16",
    "header_message",
    "inline_segment",
    "names_shared_memory",
    "read_messages",
    "references_only",
    "tensor_messages",
    "wire_nbytes",
]

# 4 MiB: large enough that per-message overhead is small, far below gRPC's message limit, and small
# enough that the receiver copies one message while the sender prepares the next.
CHUNK_BYTES = 4 << 20
_ALIGN = 64  # every tensor starts on a cache line, so the receiver's views are aligned for numpy
_LEN = struct.Struct("<I")
NamedTensor = tuple[str, np.ndarray]
_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,  # scalars such as a loss denominator
    "bfloat16": np.uint16,
    "int64": np.int64,
    "uint16": np.uint16,
    "uint8": np.uint8,
}


# A bulk transfer (transport/bulk.py). ``Park``: parks a payload's pieces with the sender's outbox and gives
# (the sender's bulk port, the transfer's id), or None where it cannot (then the bytes go inline).
# ``Fetch``: fetches transfer (port, id) from the stream's sender into a buffer of exactly its size.
Park = Callable[[list[memoryview]], "tuple[int, bytes] | None"]
Fetch = Callable[[int, bytes, memoryview], None]


class Scratch(Protocol):
    """Where a sender on the shared-memory plane copies tensors that are not in a memfd yet
    (``SharedArena.lease()``)."""

    def alloc(self, nbytes: int) -> np.ndarray: ...


def checksum(data: memoryview | np.ndarray) -> int:
    """XXH3-64 of the bytes (what TensorHeader.xxh3 holds)."""
    return xxhash.xxh3_64_intdigest(data if isinstance(data, memoryview) else data.data)


def as_bf16(arr: np.ndarray, bf16: bool) -> bool:
    """Whether ``arr`` travels as bfloat16 in a stream with ``bf16``: float32 does, everything else as is."""
    return bf16 and arr.dtype == np.float32


def wire_nbytes(arr: np.ndarray, bf16: bool) -> int:
    """The bytes ``arr``'s values take in a stream with ``bf16``."""
    return arr.nbytes // 2 if as_bf16(arr, bf16) else arr.nbytes


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
    checksums: Mapping[str, int] | None = None,
    shm: Scratch | None = None,
    park: Park | None = None,
) -> Iterator[bytes]:
    """One segment holding ``tensors``, as gRPC messages. With ``bf16``, float32 travels as bfloat16.
    ``checksums`` may give known checksums of float32 tensors sent as they are (MemoryX caches them).
    With ``shm`` the bytes stay in shared memory: each tensor by reference if it already lies in a memfd,
    else copied into one scratch memfd from ``shm``; the message is the header alone. With ``park`` the
    payload is parked as it lies for its reader to fetch (a bulk transfer) and the message is the header
    alone, naming the transfer; inline where ``park`` declines."""
    header = pb.TensorSetHeader(head=head)
    wires: list[tuple[str, tuple[int, ...], np.ndarray, str]] = []  # name, shape, bytes, wire dtype
    for name, arr in tensors:
        if as_bf16(arr, bf16):
            wire, dtype = f32_to_bf16(arr), "bfloat16"
        else:
            wire, dtype = np.ascontiguousarray(arr), arr.dtype.name
            if dtype not in _DTYPES:
                raise ProtocolError(f"tensor {name!r}: dtype {dtype} cannot be sent")
        wires.append((name, arr.shape, wire.reshape(-1).view(np.uint8), dtype))
    placed = _in_shared_memory(wires, shm) if shm is not None else {}
    views = []
    offset = 0
    for name, shape, view, dtype in wires:
        known = checksums.get(name) if checksums is not None and dtype != "bfloat16" else None
        t = header.tensors.add(
            name=name,
            dtype=dtype,
            shape=shape,
            nbytes=view.nbytes,
            xxh3=known if known is not None else checksum(view),
        )
        if name in placed:
            t.shm_pid, t.shm_fd, t.offset = placed[name]
            continue
        t.offset = offset
        views.append(view.data)
        offset += view.nbytes + _pad(view.nbytes)
    header.total_bytes = offset
    parked = park(_pieces(views)) if park is not None and offset else None
    if parked is not None:
        header.bulk_port, header.bulk_id = parked
        yield header_message(header)
        return
    yield from _inline(header, views)


def _inline(header: pb.TensorSetHeader, views: list[memoryview]) -> Iterator[bytes]:
    """The messages of a segment whose payload, ``views`` padded to the alignment, follows its header."""
    head_bytes = header.SerializeToString()
    first = True
    for parts in _payload_chunks(views):
        prefix = [_LEN.pack(len(head_bytes)), head_bytes] if first else [_LEN.pack(0)]
        yield b"".join([*prefix, *parts])
        first = False
    if first:  # no payload at all: the header alone
        yield _LEN.pack(len(head_bytes)) + head_bytes


def _in_shared_memory(
    wires: list[tuple[str, tuple[int, ...], np.ndarray, str]], shm: Scratch
) -> dict[str, tuple[int, int, int]]:
    """(pid, fd, offset) of every tensor: where it already lies in a memfd, or where it is copied to (one
    scratch memfd for all the others)."""
    out: dict[str, tuple[int, int, int]] = {}
    copy: list[tuple[str, np.ndarray]] = []
    for name, _, view, _ in wires:
        if view.nbytes == 0:
            continue  # nothing to place: it travels inline, as no bytes
        loc = locate(view)
        if loc is None:
            copy.append((name, view))
        else:
            out[name] = (loc.pid, loc.fd, loc.offset)
    if copy:
        sizes = [v.nbytes + _pad(v.nbytes) for _, v in copy]
        buf = shm.alloc(sum(sizes))
        pos = 0
        for (name, view), size in zip(copy, sizes, strict=True):
            buf[pos : pos + view.nbytes] = view
            loc = locate(buf[pos : pos + view.nbytes])
            assert loc is not None, "scratch buffers lie in memfds"
            out[name] = (loc.pid, loc.fd, loc.offset)
            pos += size
    return out


def _pieces(views: list[memoryview]) -> list[memoryview]:
    """The payload as it lies: each tensor followed by its padding."""
    out = []
    for view in views:
        out.append(view)
        if _pad(view.nbytes):
            out.append(memoryview(bytes(_pad(view.nbytes))))
    return out


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
    def __init__(
        self,
        header: pb.TensorSetHeader,
        shm_tag: str | None,
        maps: dict[tuple[int, int], np.ndarray],
        cache: MappingCache | None,
        fetch: Fetch | None,
    ) -> None:
        self.header, self.shm_tag, self.maps, self.cache = header, shm_tag, maps, cache
        raw = np.empty(header.total_bytes + _ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % _ALIGN
        self.buf = raw[start : start + header.total_bytes]  # aligned, so every tensor's view is too
        self.filled = 0
        if header.bulk_id:
            if fetch is None:
                raise ProtocolError("the stream names a bulk transfer, which this reader cannot fetch")
            fetch(header.bulk_port, header.bulk_id, self.buf.data)
            self.filled = header.total_bytes

    def add(self, data: memoryview) -> None:
        n = len(data)
        if self.filled + n > self.header.total_bytes:
            raise ProtocolError(f"segment carries more than the announced {self.header.total_bytes} bytes")
        self.buf[self.filled : self.filled + n] = np.frombuffer(data, dtype=np.uint8)
        self.filled += n

    def _shared(self, h: pb.TensorHeader) -> np.ndarray:
        """The tensor's bytes in the sender's memfd: each memfd is mapped once per stream."""
        if self.shm_tag is None:
            raise ProtocolError(f"tensor {h.name!r} is in shared memory, which this stream may not use")
        key = (h.shm_pid, h.shm_fd)
        if key not in self.maps:
            get = self.cache.attach if self.cache is not None else attach
            self.maps[key] = get(h.shm_pid, h.shm_fd, self.shm_tag)
        whole = self.maps[key]
        if h.offset + h.nbytes > len(whole):
            raise ProtocolError(f"tensor {h.name!r}: extends past its shared memory ({len(whole)} bytes)")
        return whole[h.offset : h.offset + h.nbytes]

    def tensors(self, out: dict[str, np.ndarray]) -> None:
        if self.filled != self.header.total_bytes:
            raise ProtocolError(f"segment ended after {self.filled} of {self.header.total_bytes} bytes")
        for h in self.header.tensors:
            if h.dtype not in _DTYPES:
                raise ProtocolError(f"tensor {h.name!r}: unknown wire dtype {h.dtype!r}")
            raw = self._shared(h) if h.shm_pid else self.buf[h.offset : h.offset + h.nbytes]
            if len(raw) != h.nbytes:
                raise ProtocolError(f"tensor {h.name!r}: extends past the payload")
            if checksum(raw) != h.xxh3:
                raise ChecksumError(f"tensor {h.name!r}: checksum (XXH3-64) mismatch ({h.nbytes} bytes)")
            arr = raw.view(_DTYPES[h.dtype]).reshape(tuple(h.shape))
            out[h.name] = bf16_to_f32(arr) if h.dtype == "bfloat16" else arr


def read_messages(
    messages: Iterable[bytes],
    shm_tag: str | None = None,
    cache: MappingCache | None = None,
    fetch: Fetch | None = None,
) -> tuple[pb.StreamHead | None, dict[str, np.ndarray]]:
    """Assemble a tensor stream (one or more segments) into (head or None, {name: array}), checking
    every checksum. Arrays are views into one aligned buffer per segment, or with ``shm_tag`` (this job's
    memfd tag: the receiver is on the shared-memory plane) read-only views of the senders' memfds, mapped
    through ``cache`` where given (mappings kept from call to call: ``MappingCache``). ``fetch`` fetches
    the segments whose payload is a bulk transfer (None: such a stream is refused)."""
    head: pb.StreamHead | None = None
    out: dict[str, np.ndarray] = {}
    seg: _Segment | None = None
    maps: dict[tuple[int, int], np.ndarray] = {}
    for msg in messages:
        view = memoryview(msg)
        if len(view) < _LEN.size:
            raise ProtocolError("truncated message")
        (n,) = _LEN.unpack_from(view)
        if n:
            if seg is not None:
                seg.tensors(out)
            header = _parse_header(view[_LEN.size : _LEN.size + n])
            if head is None and header.HasField("head"):
                head = header.head
            seg = _Segment(header, shm_tag, maps, cache, fetch)
        elif seg is None:
            raise ProtocolError("payload before any header")
        seg.add(view[_LEN.size + n :])
    if seg is None:
        raise ProtocolError("empty tensor stream")
    seg.tensors(out)
    return head, out


def references_only(messages: list[bytes]) -> tuple[pb.StreamHead, pb.TensorSetHeader] | None:
    """(head, header) of a stream that is one header whose every tensor lies in shared memory (or has no
    bytes): what a relay can pass on without touching, or None for any other stream. Checks nothing of
    the tensors themselves: their receiver does, end to end."""
    if len(messages) != 1:
        return None
    view = memoryview(messages[0])
    if len(view) < _LEN.size:
        raise ProtocolError("truncated message")
    (n,) = _LEN.unpack_from(view)
    if n == 0 or len(view) != _LEN.size + n:
        return None
    header = _parse_header(view[_LEN.size :])
    if header.total_bytes or any(t.nbytes and not t.shm_pid for t in header.tensors):
        return None
    if not header.HasField("head"):
        raise ProtocolError("a tensor stream pushed to a role must open with a StreamHead")
    return header.head, header


def _parse_header(view: memoryview) -> pb.TensorSetHeader:
    """The header in ``view``, parsed in place: protobuf reads any buffer, though its stubs say bytes."""
    return pb.TensorSetHeader.FromString(view)  # type: ignore[arg-type]  # parsed without a copy


def _opening_header(message: bytes) -> pb.TensorSetHeader | None:
    """The header of the segment ``message`` opens, None where it continues one."""
    view = memoryview(message)
    if len(view) < _LEN.size:
        raise ProtocolError("truncated message")
    (n,) = _LEN.unpack_from(view)
    return _parse_header(view[_LEN.size : _LEN.size + n]) if n else None


def names_shared_memory(message: bytes) -> bool:
    """Whether ``message`` opens a segment naming tensors in shared memory (then it is the whole segment:
    such a segment carries no payload)."""
    header = _opening_header(message)
    return header is not None and any(t.shm_pid for t in header.tensors)


def bulk_header(message: bytes) -> pb.TensorSetHeader | None:
    """The header of a segment whose payload is a bulk transfer, where ``message`` opens one; else None."""
    header = _opening_header(message)
    return header if header is not None and header.bulk_id else None


def inline_segment(header: pb.TensorSetHeader, payload: np.ndarray) -> Iterator[bytes]:
    """The segment ``header`` names with its ``payload`` (every byte, padding included) inline: the
    messages of a stream on gRPC alone."""
    own = pb.TensorSetHeader()
    own.CopyFrom(header)
    own.ClearField("bulk_id")
    own.ClearField("bulk_port")
    return _inline(own, [payload.data.cast("B")])  # already padded: its length is a multiple of 64


def header_message(header: pb.TensorSetHeader) -> bytes:
    """``header`` as a whole stream: the message of a stream whose tensors all lie in shared memory."""
    head_bytes = header.SerializeToString()
    return _LEN.pack(len(head_bytes)) + head_bytes

"""Tensors as frame streams: headers up front, payload in ~4 MiB frames, a crc32 per tensor, bf16 optional.

The receiver assembles the payload into one preallocated buffer (one copy out of each protobuf message,
none after) and hands out arrays that are views into it; float tensors sent as bfloat16 come back float32.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError

__all__ = ["CHUNK_BYTES", "NamedTensor", "bf16_to_f32", "f32_to_bf16", "read_frames", "tensor_frames"]

# 4 MiB: large enough that per-message overhead is small, far below gRPC's message limit, and small
# enough that the receiver copies one frame while the sender serialises the next.
CHUNK_BYTES = 4 << 20
_ALIGN = 64  # every tensor starts on a cache line, so the receiver's views are aligned for numpy
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


def tensor_frames(
    tensors: Iterable[NamedTensor], head: pb.StreamHead | None = None, bf16: bool = False
) -> Iterator[pb.TensorFrame]:
    """Frames for ``tensors`` (optionally with ``head``). With ``bf16``, float32 travels as bfloat16."""
    headers, views = [], []
    offset = 0
    for name, arr in tensors:
        if bf16 and arr.dtype == np.float32:
            wire, dtype = f32_to_bf16(arr), "bfloat16"
        else:
            wire, dtype = np.ascontiguousarray(arr), arr.dtype.name
            if dtype not in _DTYPES:
                raise ProtocolError(f"tensor {name!r}: dtype {dtype} cannot be sent")
        view = memoryview(wire.reshape(-1).view(np.uint8))
        headers.append(
            pb.TensorHeader(
                name=name,
                dtype=dtype,
                shape=arr.shape,
                offset=offset,
                nbytes=view.nbytes,
                crc32=zlib.crc32(view),
            )
        )
        views.append(view)
        offset += view.nbytes + _pad(view.nbytes)
    chunks = _chunks(views)
    first = next(chunks, b"")
    yield pb.TensorFrame(head=head, tensors=headers, total_bytes=offset, data=first)
    for data in chunks:
        yield pb.TensorFrame(data=data)


def _chunks(views: list[memoryview]) -> Iterator[bytes]:
    """The payload (tensors back to back, each padded to the alignment) cut into CHUNK_BYTES pieces."""
    parts: list[memoryview | bytes] = []
    size = 0
    for view in views:
        pieces: list[memoryview | bytes] = [view]
        if _pad(view.nbytes):
            pieces.append(bytes(_pad(view.nbytes)))
        for piece in pieces:
            pos = 0
            while pos < len(piece):
                take = min(CHUNK_BYTES - size, len(piece) - pos)
                parts.append(piece[pos : pos + take])
                size += take
                pos += take
                if size == CHUNK_BYTES:
                    yield b"".join(parts)
                    parts, size = [], 0
    if parts:
        yield b"".join(parts)


def read_frames(frames: Iterable[pb.TensorFrame]) -> tuple[pb.StreamHead | None, dict[str, np.ndarray]]:
    """Assemble a frame stream into (head or None, {name: array}), verifying every checksum."""
    it = iter(frames)
    first = next(it, None)
    if first is None:
        raise ProtocolError("empty tensor stream")
    raw = np.empty(first.total_bytes + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    buf = raw[start : start + first.total_bytes]  # cache-line aligned, so every tensor's view is too
    filled = 0
    for frame in _with_first(first, it):
        n = len(frame.data)
        if filled + n > first.total_bytes:
            raise ProtocolError(f"stream carries more than the announced {first.total_bytes} bytes")
        buf[filled : filled + n] = np.frombuffer(frame.data, dtype=np.uint8)
        filled += n
    if filled != first.total_bytes:
        raise ProtocolError(f"stream ended after {filled} of {first.total_bytes} bytes")
    out: dict[str, np.ndarray] = {}
    for h in first.tensors:
        if h.dtype not in _DTYPES:
            raise ProtocolError(f"tensor {h.name!r}: unknown wire dtype {h.dtype!r}")
        raw = buf[h.offset : h.offset + h.nbytes]
        if len(raw) != h.nbytes:
            raise ProtocolError(f"tensor {h.name!r}: extends past the payload")
        if zlib.crc32(raw) != h.crc32:
            raise ChecksumError(f"tensor {h.name!r}: crc32 mismatch ({h.nbytes} bytes)")
        arr = raw.view(_DTYPES[h.dtype]).reshape(tuple(h.shape))
        out[h.name] = bf16_to_f32(arr) if h.dtype == "bfloat16" else arr
    return (first.head if first.HasField("head") else None), out


def _with_first(first: pb.TensorFrame, rest: Iterator[pb.TensorFrame]) -> Iterator[pb.TensorFrame]:
    yield first
    for frame in rest:
        if frame.tensors or frame.HasField("head"):
            raise ProtocolError("tensor headers and the stream head may only come in the first frame")
        yield frame

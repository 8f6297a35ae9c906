"""Tensors as frame streams: ~4 MiB data frames, a crc32 per tensor, optional bfloat16 on the wire.

The receiver assembles each tensor into one preallocated buffer (one copy out of the protobuf message,
none after), checks its crc32 and returns numpy arrays; float tensors sent as bfloat16 come back float32.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError

__all__ = [
    "CHUNK_BYTES",
    "NamedTensor",
    "bf16_to_f32",
    "f32_to_bf16",
    "read_frames",
    "tensor_frames",
]

# 4 MiB: large enough that per-message overhead is small, small enough to stay far below gRPC's
# message limit and to let the receiver copy while the sender serialises the next frame.
CHUNK_BYTES = 4 << 20
NamedTensor = tuple[str, np.ndarray]
_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "int64": np.int64, "uint16": np.uint16}


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan.reshape(out.shape)] = 0x7FC0
    return out


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def tensor_frames(
    tensors: Iterable[NamedTensor], head: pb.StreamHead | None = None, bf16: bool = False
) -> Iterator[pb.TensorFrame]:
    """Frames for ``tensors`` (optionally led by ``head``). With ``bf16`` float32 tensors travel as bfloat16."""
    if head is not None:
        yield pb.TensorFrame(head=head)
    for name, arr in tensors:
        if bf16 and arr.dtype == np.float32:
            wire, dtype = f32_to_bf16(arr), "bfloat16"
        else:
            wire, dtype = np.ascontiguousarray(arr), arr.dtype.name
            if dtype not in _DTYPES:
                raise ProtocolError(f"tensor {name!r}: dtype {dtype} cannot be sent")
        view = memoryview(wire.reshape(-1).view(np.uint8))
        header = pb.TensorHeader(name=name, dtype=dtype, shape=arr.shape, nbytes=view.nbytes, crc32=zlib.crc32(view))
        yield pb.TensorFrame(tensor=header)
        for off in range(0, view.nbytes, CHUNK_BYTES):
            yield pb.TensorFrame(data=view[off : off + CHUNK_BYTES].tobytes())


def read_frames(frames: Iterable[pb.TensorFrame]) -> tuple[pb.StreamHead | None, dict[str, np.ndarray]]:
    """Assemble a frame stream into (head or None, {name: array}), verifying every checksum."""
    head: pb.StreamHead | None = None
    out: dict[str, np.ndarray] = {}
    current: pb.TensorHeader | None = None
    buf: np.ndarray | None = None
    filled = 0

    def finish() -> None:
        assert current is not None and buf is not None
        if filled != current.nbytes:
            raise ProtocolError(f"tensor {current.name!r}: got {filled} of {current.nbytes} bytes")
        if zlib.crc32(buf) != current.crc32:
            raise ChecksumError(f"tensor {current.name!r}: crc32 mismatch ({current.nbytes} bytes)")
        arr = buf.view(_DTYPES[current.dtype]).reshape(tuple(current.shape))
        out[current.name] = bf16_to_f32(arr) if current.dtype == "bfloat16" else arr

    for frame in frames:
        kind = frame.WhichOneof("kind")
        if kind == "head":
            if head is not None or current is not None:
                raise ProtocolError("a stream head may only open a stream")
            head = frame.head
        elif kind == "tensor":
            if current is not None:
                finish()
            current = frame.tensor
            if current.dtype not in _DTYPES:
                raise ProtocolError(f"tensor {current.name!r}: unknown wire dtype {current.dtype!r}")
            buf = np.empty(current.nbytes, dtype=np.uint8)
            filled = 0
        elif kind == "data":
            if current is None or buf is None:
                raise ProtocolError("data frame before any tensor header")
            n = len(frame.data)
            if filled + n > current.nbytes:
                raise ProtocolError(f"tensor {current.name!r}: more than {current.nbytes} bytes")
            buf[filled : filled + n] = np.frombuffer(frame.data, dtype=np.uint8)
            filled += n
    if current is not None:
        finish()
    return head, out


def ordered(tensors: dict[str, np.ndarray], names: Sequence[str]) -> list[NamedTensor]:
    return [(n, tensors[n]) for n in names]

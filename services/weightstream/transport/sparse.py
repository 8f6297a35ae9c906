"""A sparse tensor on the wire: its kept values plus a compact index of where they go.

A sparse weight [R, C] travels as two tensors of the ordinary stream format (so every part carries its
own checksum over exactly the bytes sent, and a relay forwards them untouched):

- ``<name>``: the kept values, 1-D, in ascending position order (bfloat16 when the job uses it);
- ``<name>::bitmask`` or ``<name>::delta``: the index, bytes (uint8), whichever is smaller at that density:
  a bitmask costs R*C/8 bytes whatever the density; delta codes cost about one byte per kept entry (the gap
  to the previous kept entry, 1..255; a 0 byte stands for "255 further, nothing kept"), so they win below
  a density of about 1/8.

The receiver knows the dense shape from the model; a gradient goes back as values alone (the sender of the
weights already knows the positions). Decoding checks everything a hostile or broken peer could get wrong
(counts, bounds) and raises ``ProtocolError`` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

import numpy as np

from weightstream.transport.errors import ProtocolError

__all__ = ["INDEX_KINDS", "decode_index", "encode_index", "index_name", "split_index"]

IndexKind = Literal["bitmask", "delta"]
INDEX_KINDS: tuple[str, ...] = get_args(IndexKind)  # the Literal's values, in order
_SEP = "::"
_RUN = 255  # the longest gap one delta byte holds; a 0 byte adds this much and keeps nothing


def index_name(name: str, kind: str) -> str:
    return f"{name}{_SEP}{kind}"


def encode_index(positions: np.ndarray, numel: int) -> tuple[IndexKind, np.ndarray]:
    """(kind, bytes) for ascending flat ``positions`` in a tensor of ``numel`` entries: the smaller code."""
    gaps = np.diff(positions.astype(np.int64), prepend=np.int64(-1))  # >= 1 each
    zeros = (gaps - 1) // _RUN  # filler bytes before each gap's own byte
    delta_len = int(zeros.sum()) + len(gaps)
    bitmask_len = -(-numel // 8)
    if bitmask_len <= delta_len:
        mask = np.zeros(numel, dtype=bool)
        mask[positions] = True
        return "bitmask", np.packbits(mask, bitorder="little")
    out = np.zeros(delta_len, dtype=np.uint8)
    last = np.cumsum(zeros + 1) - 1  # where each gap's own byte goes
    out[last] = (gaps - _RUN * zeros).astype(np.uint8)  # 1..255
    return "delta", out


def decode_index(name: str, kind: str, data: np.ndarray, numel: int, count: int) -> np.ndarray:
    """Ascending flat positions (int64) from an index of ``kind``; ``count`` is how many values came."""
    data = data.reshape(-1).view(np.uint8)
    if kind == "bitmask":
        if len(data) != -(-numel // 8):
            raise ProtocolError(f"{name}: bitmask of {len(data)} bytes for {numel} entries")
        bits = np.unpackbits(data, bitorder="little")
        if bits[numel:].any():
            raise ProtocolError(f"{name}: bitmask marks entries past the tensor's {numel}")
        positions = np.flatnonzero(bits[:numel])
    elif kind == "delta":
        if len(data) and data[-1] == 0:
            raise ProtocolError(f"{name}: delta index ends in a filler byte")
        steps = np.where(data == 0, _RUN, data).astype(np.int64)
        positions = (np.cumsum(steps) - 1)[data != 0]
        if len(positions) and positions[-1] >= numel:
            raise ProtocolError(f"{name}: delta index points past the tensor's {numel} entries")
    else:
        raise ProtocolError(f"{name}: unknown sparse index kind {kind!r}")
    if len(positions) != count:
        raise ProtocolError(f"{name}: index holds {len(positions)} entries, {count} values came")
    return positions.astype(np.int64, copy=False)


def split_index(
    tensors: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, np.ndarray]]]:
    """(the tensors without index entries, {name: (kind, index bytes)} for each sparse one)."""
    plain: dict[str, np.ndarray] = {}
    indexes: dict[str, tuple[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        if _SEP in key:
            name, kind = key.rsplit(_SEP, 1)
            indexes[name] = (kind, arr)
        else:
            plain[key] = arr
    missing = [n for n in indexes if n not in plain]
    if missing:
        raise ProtocolError(f"sparse index without values: {missing}")
    return plain, indexes

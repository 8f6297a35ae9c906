"""Checkpoint files: safetensors, in Hugging Face's single-file or sharded-with-index layout.

A checkpoint directory holds ``model.safetensors`` (one file) or ``model-0000i-of-0000K.safetensors`` plus
``model.safetensors.index.json``, the same for ``optimizer``, and ``trainer_state.json``. Each MemoryX
shard writes its own files (``checkpoint_layout.checkpoint_files`` says which tensor goes where, split at
``runconfig.checkpoint_max_shard_size`` as ``save_pretrained(max_shard_size=...)`` does); the coordinator
writes the index and renames the directory into place.

Both directions stream: a file is written tensor by tensor, block by block, from wherever the shard keeps
its tensors, and read back one tensor at a time, so neither ever holds more than one tensor of the model.
"""

from __future__ import annotations

import json
import os
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from weightstream.checkpoint_layout import TRAINER_STATE, shard_file_name
from weightstream.hf_checkpoint import bin_tensors, stored_names
from weightstream.storage_io import FILE_MODE, fsync_dir

__all__ = [
    "NonFiniteError",
    "TensorSource",
    "iter_tensors",
    "load_tensors",
    "read_step",
    "start_tensors",
    "write_safetensors",
]

# name, shape, and a function giving the tensor's values (float32, or bool for masks) flat in blocks
TensorSource = tuple[str, tuple[int, ...], Callable[[], Iterable[np.ndarray]]]
# the file dtypes written: safetensors' name -> numpy's (every tensor of a file has the file's dtype)
_DTYPES: dict[str, type] = {"F32": np.float32, "BOOL": np.bool_}


class NonFiniteError(ValueError):
    """A tensor to be written holds NaN or infinity: such a checkpoint is never written."""


def _header(tensors: Sequence[TensorSource], dtype: str) -> bytes:
    """The safetensors header: little-endian u64 length, then JSON padded with spaces to 8 bytes."""
    meta: dict[str, object] = {"__metadata__": {"format": "pt"}}  # what from_pretrained expects
    offset = 0
    itemsize = np.dtype(_DTYPES[dtype]).itemsize
    for name, shape, _ in tensors:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        meta[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: Path, tensors: Sequence[TensorSource], dtype: str = "F32") -> None:
    """Write ``tensors`` to ``path`` durably (temp name, fsync, rename, fsync the directory), one block in
    memory at a time. Every value is checked on the way: if any tensor is not finite, nothing is left at
    ``path`` and NonFiniteError names the tensors. ``dtype``: "F32", or "BOOL" (masks)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.unlink(missing_ok=True)
    bad: list[str] = []
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with open(fd, "wb") as f:
            f.write(_header(tensors, dtype))
            for i, (name, _, blocks) in enumerate(tensors):
                if not _write_tensor(
                    f, blocks, _DTYPES[dtype]
                ):  # write nothing more, but name every bad tensor
                    bad = [name] + [n for n, _, rest in tensors[i + 1 :] if not _finite(rest)]
                    break
            else:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if bad:
        tmp.unlink(missing_ok=True)
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteError(f"non-finite values in {shown}")
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_tensor(f: BinaryIO, blocks: Callable[[], Iterable[np.ndarray]], dtype: type) -> bool:
    """Write one tensor's blocks; False (and stop) at the first block holding NaN or infinity."""
    for block in blocks():
        if not np.isfinite(block).all():
            return False
        f.write(np.ascontiguousarray(block, dtype=dtype).data.cast("B"))
    return True


def _finite(blocks: Callable[[], Iterable[np.ndarray]]) -> bool:
    return all(np.isfinite(b).all() for b in blocks())


def iter_tensors(
    directory: str | Path, prefix: str, names: Sequence[str], dtype: type = np.float32
) -> Iterator[tuple[str, np.ndarray]]:
    """The named tensors of ``prefix`` (model, optimizer, sparsity_masks) from a checkpoint, wherever they
    are sharded, one at a time (each a fresh writable array of ``dtype``). Only the files holding them are
    opened."""
    from safetensors import safe_open

    d = Path(directory)
    index = d / f"{prefix}.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    else:
        if not (d / shard_file_name(prefix, 0, 1)).exists():
            raise FileNotFoundError(f"checkpoint {d} has no {prefix} tensors")
        weight_map = defaultdict(lambda: shard_file_name(prefix, 0, 1))
    by_file: dict[str, list[str]] = defaultdict(list)
    for n in names:
        if index.exists() and n not in weight_map:
            raise KeyError(f"checkpoint {d} has no tensor {n!r} in {prefix}")
        by_file[weight_map[n]].append(n)
    for file, file_names in by_file.items():
        with safe_open(str(d / file), framework="numpy") as f:
            have = set(f.keys())
            for n in file_names:
                if n not in have:
                    raise KeyError(f"checkpoint file {d / file} has no tensor {n!r}")
                yield n, np.array(f.get_tensor(n), dtype=dtype)  # a writable copy


def start_tensors(directory: str | Path, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
    """The tensors ``names`` (ours) of a Hugging Face directory (``hf_checkpoint``: safetensors, or
    pytorch_model*.bin read with torch), one at a time, grouped by the file holding them, as fresh float32
    arrays; FileNotFoundError naming what is missing."""
    found, _ = stored_names(Path(directory), names)
    missing = [n for n in names if n not in found]
    if missing:
        raise FileNotFoundError(
            f"{directory} lacks {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    ours = {stored: n for n, (stored, _) in found.items()}
    if any(f.endswith(".bin") for _, f in found.values()):  # no safetensors beside them (hf_checkpoint)
        tensors = bin_tensors(Path(directory), [found[n] for n in names])
    else:
        tensors = iter_tensors(directory, "model", [found[n][0] for n in names])
    for stored, w in tensors:
        yield ours[stored], w


def read_step(directory: str | Path) -> int:
    return int(json.loads((Path(directory) / TRAINER_STATE).read_text())["global_step"])


def load_tensors(
    directory: str | Path, prefix: str, names: Sequence[str]
) -> tuple[dict[str, np.ndarray], int]:
    """All the named tensors at once, and the checkpoint's step: for tools and tests on small models."""
    return dict(iter_tensors(directory, prefix, names)), read_step(directory)

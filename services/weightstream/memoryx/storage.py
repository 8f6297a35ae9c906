"""Checkpoint files: safetensors, in Hugging Face's single-file or sharded-with-index layout.

A checkpoint directory holds ``model.safetensors`` (one shard) or ``model-0000i-of-0000K.safetensors`` plus
``model.safetensors.index.json``, the same for ``optimizer``, and ``trainer_state.json``. Each MemoryX
shard writes its own file; the coordinator writes the index and renames the directory into place.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from weightstream.checkpoint_layout import TRAINER_STATE, shard_file_name
from weightstream.storage_io import write_bytes_durably

__all__ = ["load_tensors", "write_safetensors"]


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save

    # "format": "pt" is what transformers' from_pretrained expects in the metadata
    write_bytes_durably(
        path, save({n: np.ascontiguousarray(t) for n, t in tensors.items()}, metadata={"format": "pt"})
    )


def load_tensors(
    directory: str | Path, prefix: str, names: Sequence[str]
) -> tuple[dict[str, np.ndarray], int]:
    """The named tensors of ``prefix`` (model or optimizer) from a checkpoint, wherever they are sharded,
    and the checkpoint's step. Only the files holding them are opened, and only those tensors read."""
    from safetensors import safe_open

    d = Path(directory)
    index = d / f"{prefix}.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    else:
        weight_map = defaultdict(lambda: shard_file_name(prefix, 0, 1))
    by_file: dict[str, list[str]] = defaultdict(list)
    for n in names:
        if index.exists() and n not in weight_map:
            raise KeyError(f"checkpoint {d} has no tensor {n!r} in {prefix}")
        by_file[weight_map[n]].append(n)
    out: dict[str, np.ndarray] = {}
    for file, file_names in by_file.items():
        with safe_open(str(d / file), framework="numpy") as f:
            have = set(f.keys())
            for n in file_names:
                if n not in have:
                    raise KeyError(f"checkpoint file {d / file} has no tensor {n!r}")
                out[n] = np.array(f.get_tensor(n), dtype=np.float32)  # a writable copy
    step = int(json.loads((d / TRAINER_STATE).read_text())["global_step"])
    return out, step

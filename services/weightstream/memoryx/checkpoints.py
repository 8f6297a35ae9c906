"""A MemoryX shard's checkpoints: loading one into its store (``load_checkpoint``) and writing the weights,
optimizer state and masks of a step from it (``write_checkpoint``), tensor by tensor or block by block.

Sparse tensors are written dense, zeros at the pruned entries (Hugging Face loads the files as they are),
with their masks in a file of their own; a dense checkpoint loaded into a sparse run makes its masks from
the weights. A checkpoint is written under the shard's lock with no update in flight, so its weights and
state are all of one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors import safe_open

from weightstream.checkpoint_layout import MASKS
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.storage import (
    NonFiniteError,
    TensorSource,
    iter_tensors,
    read_step,
    write_safetensors,
)

__all__ = ["load_checkpoint", "write_checkpoint"]

# (file, the keys it holds): where a shard writes what (``checkpoint_layout.checkpoint_files``)
Files = Sequence[tuple[Path, Sequence[str]]]


def load_checkpoint(state: ShardState, resume_dir: str) -> int:
    """Fill ``state``'s empty store from the checkpoint in ``resume_dir``; return its step."""
    masks = _mask_files(state, resume_dir)
    sparse, store = state.sparse, state.store
    for n, w in iter_tensors(resume_dir, "model", state.names):
        if n in sparse:
            if n in masks:
                sparse.load_mask(n, _read_mask(masks[n], n))
                w = sparse.compact(n, w)
            else:  # a dense checkpoint made sparse: the mask from its weights (topk prunes them)
                w = sparse.make(n, w)
        store.put(n, w)
    keys = [k for n in state.names for k in state.state_keys[n]]
    for key, v in iter_tensors(resume_dir, "optimizer", keys):
        n = key.rsplit(".", 1)[0]
        store.put(key, sparse.compact(n, v) if n in sparse else v)
    return read_step(resume_dir)


def write_checkpoint(
    state: ShardState,
    progress: ShardProgress,
    step: int,
    model_files: Files,
    optimizer_files: Files,
    mask_files: Files = (),
) -> None:
    """Write the weights (and optimizer state, flattened as '<tensor>.<state>') of ``step`` into the
    given files, streaming from the store, once no update is in flight; ValueError if the shard is at
    another step. Raises ValueError naming the tensors if any value is NaN or infinite: such a checkpoint
    is never written (the coordinator stops a diverging run earlier; this holds whatever it does)."""
    with progress:
        progress.idle()
        if step != progress.step:
            raise ValueError(f"checkpoint of step {step} requested, shard is at step {progress.step}")
        try:
            for path, keys in (*model_files, *optimizer_files):
                write_safetensors(path, [_source(state, k) for k in keys])
            for path, names in mask_files:
                masks = [
                    (n, state.model.specs[n].shape, lambda n=n: state.sparse.mask_blocks(n)) for n in names
                ]
                write_safetensors(path, masks, dtype="BOOL")
        except NonFiniteError as e:
            raise ValueError(f"refusing to checkpoint step {step}: {e}") from None


def _source(state: ShardState, key: str) -> TensorSource:
    name = state.tensor_of(key)
    if name in state.sparse:  # dense, with zeros at the pruned entries
        return (
            key,
            state.model.specs[name].shape,
            lambda: state.sparse.dense_blocks(name, state.store.get(key)),
        )
    return key, state.model.specs[name].shape, lambda: state.store.blocks(key)


def _mask_files(state: ShardState, resume_dir: str) -> dict[str, Path]:
    """Where the checkpoint keeps the mask of each of the shard's sparse tensors (a dense checkpoint:
    nowhere)."""
    found: dict[str, Path] = {}
    sparse = state.sparse
    for path in sorted(Path(resume_dir).glob(f"{MASKS}*.safetensors")) if sparse else []:
        with safe_open(str(path), framework="numpy") as f:
            found |= {n: path for n in f.keys() if n in sparse}  # noqa: SIM118 (not a dict)
    return found


def _read_mask(path: Path, name: str) -> np.ndarray:
    with safe_open(str(path), framework="numpy") as f:
        return np.asarray(f.get_tensor(name), dtype=bool)

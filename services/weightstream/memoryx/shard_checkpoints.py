"""A MemoryX shard's checkpoints: loading one into the store (``_load``) and writing the weights, optimizer
state and masks of a step from it (``write_checkpoint``), tensor by tensor or block by block. A mixin of
``MemoryXShard`` (memoryx/shard.py), whose lock, store and step it uses."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors import safe_open

from weightstream.checkpoint_layout import MASKS
from weightstream.memoryx.sparse import SparseTensors
from weightstream.memoryx.storage import (
    NonFiniteError,
    TensorSource,
    iter_tensors,
    read_step,
    write_safetensors,
)
from weightstream.memoryx.store import TensorStore
from weightstream.numerics import ModelDef

__all__ = ["ShardCheckpoints"]


def _read_mask(path: Path, name: str) -> np.ndarray:
    with safe_open(str(path), framework="numpy") as f:
        return np.asarray(f.get_tensor(name), dtype=bool)


class ShardCheckpoints:
    # what MemoryXShard provides
    model: ModelDef
    names: tuple[str, ...]
    store: TensorStore
    sparse: SparseTensors
    state_keys: dict[str, list[str]]
    users: dict[str, tuple[int, ...]]
    step: int
    _cond: threading.Condition

    def _idle(self) -> None: ...

    def _load(self, resume_dir: str) -> None:
        masks = self._mask_files(resume_dir)
        for n, w in iter_tensors(resume_dir, "model", self.names):
            if n in self.sparse:
                if n in masks:
                    self.sparse.load_mask(n, _read_mask(masks[n], n))
                    w = self.sparse.compact(n, w)
                else:  # a dense checkpoint made sparse: the mask from its weights (topk prunes them)
                    w = self.sparse.make(n, w)
            self.store.put(n, w)
        keys = [k for n in self.names for k in self.state_keys[n]]
        for key, v in iter_tensors(resume_dir, "optimizer", keys):
            n = key.rsplit(".", 1)[0]
            self.store.put(key, self.sparse.compact(n, v) if n in self.sparse else v)
        self.step = read_step(resume_dir)

    def _mask_files(self, resume_dir: str) -> dict[str, Path]:
        """Where the checkpoint keeps the mask of each of this shard's sparse tensors (a dense
        checkpoint: nowhere)."""
        found: dict[str, Path] = {}
        for path in sorted(Path(resume_dir).glob(f"{MASKS}*.safetensors")) if self.sparse else []:
            with safe_open(str(path), framework="numpy") as f:
                found |= {n: path for n in f.keys() if n in self.sparse}  # noqa: SIM118 (not a dict)
        return found

    # -- checkpoints ---------------------------------------------------------------------------------------
    def write_checkpoint(
        self,
        step: int,
        model_files: Sequence[tuple[Path, Sequence[str]]],
        optimizer_files: Sequence[tuple[Path, Sequence[str]]],
        mask_files: Sequence[tuple[Path, Sequence[str]]] = (),
    ) -> None:
        """Write the weights (and optimizer state, flattened as '<tensor>.<state>') of ``step`` into the
        given files, streaming from the store. Raises ValueError naming the tensors if any value is NaN or
        infinite: such a checkpoint is never written (the coordinator stops a diverging run earlier; this
        holds whatever it does)."""
        with self._cond:
            self._idle()
            if step != self.step:
                raise ValueError(f"checkpoint of step {step} requested, shard is at step {self.step}")
            try:
                for path, keys in (*model_files, *optimizer_files):
                    write_safetensors(path, [self._source(k) for k in keys])
                for path, names in mask_files:
                    masks = [
                        (n, self.model.specs[n].shape, lambda n=n: self.sparse.mask_blocks(n)) for n in names
                    ]
                    write_safetensors(path, masks, dtype="BOOL")
            except NonFiniteError as e:
                raise ValueError(f"refusing to checkpoint step {step}: {e}") from None

    def _source(self, key: str) -> TensorSource:
        name = key if key in self.users else key.rsplit(".", 1)[0]
        if name in self.sparse:  # dense, with zeros at the pruned entries
            return (
                key,
                self.model.specs[name].shape,
                lambda: self.sparse.dense_blocks(name, self.store.get(key)),
            )
        return key, self.model.specs[name].shape, lambda: self.store.blocks(key)

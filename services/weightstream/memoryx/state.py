"""What a MemoryX shard holds, in its store: the fp32 master weights of its tensors and their optimizer
state (``<tensor>.<state>``: torch's names), sparse tensors compact (``memoryx.sparse``), and which units
use each tensor (two for a tied embedding: both send it a gradient).

The store is chosen once by whoever builds the shard (``MemoryStore`` or ``DiskStore``); nothing here
asks which it is. Initial weights come from the seed or a Hugging Face directory (``fill``), or from a
checkpoint (``memoryx.checkpoints.load_checkpoint``), one tensor at a time straight into the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from weightstream.memoryx.sparse import SparseTensors
from weightstream.memoryx.storage import start_tensors
from weightstream.memoryx.store import TensorStore
from weightstream.numerics import ModelDef, OptimizerConfig
from weightstream.numerics.model import init_tensor
from weightstream.numerics.optim import state_names
from weightstream.numerics.sparse_masks import SparsitySpec

__all__ = ["ShardState"]


class ShardState:
    def __init__(
        self,
        model: ModelDef,
        opt: OptimizerConfig,
        names: Sequence[str],
        store: TensorStore,
        sparsity: Mapping[str, SparsitySpec] | None = None,
    ) -> None:
        """``names``: this shard's tensors (the store starts empty: ``fill`` or a checkpoint fills it);
        ``sparsity``: a spec per sparse tensor of the model (those of other shards are ignored)."""
        self.model, self.opt, self.names, self.store = model, opt, tuple(names), store
        self.state_keys = {n: [f"{n}.{k}" for k in state_names(opt.kind)] for n in self.names}
        # which units contribute a gradient to each tensor (two for a tied embedding)
        self.users = {
            n: tuple(u for u, unit in enumerate(model.units) if n in unit.param_names) for n in self.names
        }
        mine = {n: s for n, s in (sparsity or {}).items() if n in self.users}
        # with an arena, the masks' indexes live in memfds beside the weights
        self.sparse = SparseTensors(mine, {n: model.specs[n].shape for n in mine}, store.arena)

    def fill(self, seed: int, init_dir: str | None = None) -> None:
        """The initial weights, from ``seed`` or (``init_dir``) a Hugging Face directory, and zero state."""
        initial = (
            start_tensors(init_dir, self.names)
            if init_dir is not None
            else ((n, init_tensor(self.model.specs[n], seed)) for n in self.names)
        )
        for n, w in initial:  # one tensor at a time, straight into the store
            if w.shape != self.model.specs[n].shape:  # checked by the coordinator; holds if it changed
                raise ValueError(f"{init_dir}: {n} has shape {w.shape}, not {self.model.specs[n].shape}")
            if n in self.sparse:  # the mask: from (seed, name), or the loaded weights (topk)
                w = self.sparse.make(n, w)
            self.store.put(n, w)
            for key in self.state_keys[n]:
                self.store.zeros(key, w.shape)

    def shape(self, name: str) -> tuple[int, ...]:
        """What the store holds of tensor ``name`` (and its gradient): compact if sparse."""
        return self.sparse.compact_shape(name) if name in self.sparse else self.model.specs[name].shape

    def tensor_of(self, key: str) -> str:
        """The tensor a weight or state key belongs to (``<tensor>`` or ``<tensor>.<state>``)."""
        return key if key in self.users else key.rsplit(".", 1)[0]

    def weight(self, name: str) -> np.ndarray:
        """Tensor ``name`` as it is stored (compact if sparse: ``dense`` for the full tensor)."""
        return self.store.get(name)

    def dense(self, key: str) -> np.ndarray:
        """Weight or state buffer ``key`` in its dense shape (zeros at pruned entries)."""
        name = self.tensor_of(key)
        value = self.store.get(key)
        return self.sparse.dense(name, value) if name in self.sparse else value

    def state(self, name: str) -> dict[str, np.ndarray]:
        """The optimizer state buffers of tensor ``name``, by torch's names (as stored)."""
        return {key.rsplit(".", 1)[1]: self.store.get(key) for key in self.state_keys[name]}

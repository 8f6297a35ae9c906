"""One MemoryX shard: the fp32 master weights and optimizer state of the units assigned to it.

Step protocol (the coordinator drives it, each call with a deadline):
  tensors(step)           weights after ``step`` updates (waits until they are: while the update of
                          ``step - 1`` is being applied, a tensor is served as soon as it is updated, so
                          the workers' next forward overlaps the rest of the update)
  add_gradient(step, u)   the reduced gradient of unit u for this step (a tied tensor gets one per unit)
  grad_sq_sum(step)       waits until every expected gradient is in, returns their sum of squares (a tied
                          tensor's parts added in unit order: the same bits whatever the arrival order);
                          in memory mode computed in the background as each gradient completes
  apply_update(step, ..)  clip, optimizer step; idempotent: a repeated call for an applied step is a no-op

Where the tensors live is a ``store``: RAM (``MemoryStore``) or files read and written in blocks
(``DiskStore``, ``runconfig.memoryx_storage: disk``). Every operation streams through the store tensor by
tensor or block by block, initialisation, loading and checkpoint writing included, so in disk mode the
shard's resident memory is bounded by the tensors of one unit in flight, whatever the model's size.

Sparse tensors (``sparsity``: a ``SparsitySpec`` per tensor) are held compact, their kept entries only,
with their optimizer state and gradients alike; they travel as values plus an index (``memoryx.sparse``).

Fault recovery: ``reset(generation)`` keeps the weights and optimizer state and drops the gradients of an
interrupted step; from then on gradients, norms and updates of any other generation are refused (checked
under the shard's lock, so a push of the old attempt can never land after the reset).

``MemoryXShard`` only assembles the pieces, each a module of its own and usable alone:
  state.ShardState          what the shard holds, in its store (weights, state, masks, units per tensor)
  progress.ShardProgress    the step, the generation, the update in flight, closing; the shared lock
  serving.WeightServing     weights out, early serving, the checksum cache
  gradients.StepGradients   the step's gradients and their sum of squares (in the background in RAM)
  update.ShardUpdate        the step protocol's calls in and the optimizer applied
  checkpoints               loading and writing checkpoints
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from weightstream.memoryx.checkpoints import Files, load_checkpoint, write_checkpoint
from weightstream.memoryx.errors import ShardClosedError, StaleStepError
from weightstream.memoryx.gradients import StepGradients
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.serving import WeightServing
from weightstream.memoryx.state import ShardState
from weightstream.memoryx.store import DiskStore, MemoryStore, TensorStore
from weightstream.memoryx.update import ShardUpdate
from weightstream.numerics import ModelDef, OptimizerConfig
from weightstream.numerics.sparse_masks import SparsitySpec
from weightstream.transport.shm import SharedArena
from weightstream.transport.shm_cache import MappingCache

__all__ = ["MemoryXShard", "ShardClosedError", "StaleStepError"]


class MemoryXShard:
    def __init__(
        self,
        model: ModelDef,
        opt: OptimizerConfig,
        names: Sequence[str],
        seed: int,
        timeout_s: float,
        resume_dir: str | None = None,
        storage_dir: Path | None = None,
        generation: int = 0,
        arena: SharedArena | None = None,
        sparsity: Mapping[str, SparsitySpec] | None = None,
        init_dir: str | None = None,
    ) -> None:
        """``storage_dir``: keep weights, optimizer state and gradients in files there instead of RAM, so
        a shard can hold more than the machine's memory (the kernel's page cache keeps the hot part).
        ``arena`` (memory mode): keep the weights in memfds that co-located workers map (the shard owns
        and closes it). ``init_dir``: without ``resume_dir``, the initial weights come from this Hugging
        Face directory (``hf_checkpoint``) instead of the seed, one tensor at a time; state starts at 0."""
        store: TensorStore = DiskStore(storage_dir) if storage_dir is not None else MemoryStore(arena, names)
        self.held = ShardState(model, opt, names, store, sparsity)
        step = 0
        try:
            if resume_dir is None:
                self.held.fill(seed, init_dir)
            else:
                step = load_checkpoint(self.held, resume_dir)
        except BaseException:
            store.close()
            raise
        self.progress = ShardProgress(timeout_s, step, generation)
        self.gradients = StepGradients(self.held)
        self.serving = WeightServing(self.held, self.progress)
        self.updater = ShardUpdate(self.held, self.progress, self.gradients, self.serving.checksums)
        # gradient memfds' mappings, kept as senders keep them (memory mode; ``reset`` drops them)
        self.grad_maps = MappingCache(2 * len(model.units) if arena is not None else 0)
        # what callers read of the shard (the service, tools and tests)
        self.model, self.opt, self.names, self.store = model, opt, self.held.names, store
        self.sparse, self.state_keys, self.users = self.held.sparse, self.held.state_keys, self.held.users

    @property
    def step(self) -> int:
        """The updates the weights have had."""
        return self.progress.step

    @property
    def generation(self) -> int:
        """The generation whose calls are accepted."""
        return self.progress.generation

    @property
    def served_early(self) -> int:
        """Tensors served while the rest of their step's update was still running (for tests and
        operators)."""
        return self.serving.served_early

    def reset(self, generation: int) -> None:
        """Forget the gradients of the step in progress and accept only calls of ``generation`` from now
        on: the coordinator re-runs that step after a fault elsewhere. Weights and state stay."""
        with self.progress:
            self.progress.idle()  # an update being applied completes first: never left half-updated
            self.progress.generation = generation
            self.gradients.drop()
            self.grad_maps.close()
            self.progress.notify()  # waiters of the old generation wake up and give up

    def close(self) -> None:
        """Wake every call waiting here (they fail with ShardClosedError: a handler left waiting out its
        timeout would hold its stopping process alive), let an update being applied finish (its store is
        never freed under it), then free the store (disk mode: the files are scratch, checkpoints are the
        durable copy)."""
        self.gradients.close()
        with self.progress:
            self.progress.close()
            self.grad_maps.close()
            self.store.close()

    # -- weights out -----------------------------------------------------------------------------------------
    def tensors(self, step: int, names: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """The weights after ``step`` updates, once they are (``WeightServing.tensors``)."""
        return self.serving.tensors(step, names)

    def checksums(self, tensors: Sequence[tuple[str, np.ndarray]]) -> dict[str, int]:
        """XXH3-64 checksums of ``tensors`` (as ``tensors()`` returned them), cached until the next update."""
        return self.serving.checksums.of(tensors)

    @property
    def shares_weights(self) -> bool:
        """Whether the weights live in memfds (the shared-memory plane), so they are sent by reference."""
        return self.serving.shares_weights

    def weight(self, name: str) -> np.ndarray:
        """Tensor ``name`` as it is stored (compact if sparse: ``dense`` for the full tensor)."""
        return self.held.weight(name)

    def dense(self, key: str) -> np.ndarray:
        """Weight or state buffer ``key`` in its dense shape (zeros at pruned entries)."""
        return self.held.dense(key)

    def state(self, name: str) -> dict[str, np.ndarray]:
        """The optimizer state buffers of tensor ``name``, by torch's names (as stored)."""
        return self.held.state(name)

    # -- the step --------------------------------------------------------------------------------------------
    def add_gradient(
        self, step: int, unit: int, grads: Mapping[str, np.ndarray], generation: int = 0
    ) -> None:
        """Unit ``unit``'s reduced gradients of ``step`` (compact where sparse)."""
        self.updater.add_gradient(step, unit, grads, generation)

    def grad_sq_sum(self, step: int, generation: int = 0) -> float:
        """The sum of squares of ``step``'s gradients, once every expected one is in (float64)."""
        return self.updater.grad_sq_sum(step, generation)

    def apply_update(self, step: int, lr: float, clip_coef: float, generation: int = 0) -> bool:
        """Apply the optimizer for ``step`` (gradients scaled by ``clip_coef``); False if applied already."""
        return self.updater.apply_update(step, lr, clip_coef, generation)

    # -- checkpoints -----------------------------------------------------------------------------------------
    def write_checkpoint(
        self, step: int, model_files: Files, optimizer_files: Files, mask_files: Files = ()
    ) -> None:
        """Write ``step``'s weights, state and masks into these files (``checkpoints.write_checkpoint``)."""
        write_checkpoint(self.held, self.progress, step, model_files, optimizer_files, mask_files)

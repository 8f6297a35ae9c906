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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from weightstream.memoryx import grad_sums
from weightstream.memoryx.shard_checkpoints import ShardCheckpoints
from weightstream.memoryx.sparse import SparseTensors
from weightstream.memoryx.storage import start_tensors
from weightstream.memoryx.store import DiskStore, MemoryStore, TensorStore
from weightstream.numerics import ModelDef, OptimizerConfig
from weightstream.numerics.model import init_tensor
from weightstream.numerics.optim import state_names, update_blocks
from weightstream.numerics.sparse_masks import SparsitySpec
from weightstream.transport.errors import RoleClosedError
from weightstream.transport.fencing import check_generation
from weightstream.transport.shm import SharedArena
from weightstream.transport.shm_cache import MappingCache
from weightstream.transport.tensors import checksum

__all__ = ["MemoryXShard", "ShardClosedError", "StaleStepError"]

log = logging.getLogger("weightstream.memoryx")


class StaleStepError(ValueError):
    """A call names a step this shard has already moved past (or has not reached)."""


class ShardClosedError(RoleClosedError):
    """The shard was closed (its role is stopping, or a new configuration replaced it) during a call."""


class MemoryXShard(ShardCheckpoints):
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
        self.model, self.opt, self.names, self.timeout_s = model, opt, tuple(names), timeout_s
        self.store: TensorStore = (
            DiskStore(storage_dir) if storage_dir is not None else MemoryStore(arena, self.names)
        )
        self.state_keys = {n: [f"{n}.{k}" for k in state_names(opt.kind)] for n in self.names}
        # which units contribute a gradient to each tensor (two for a tied embedding)
        self.users = {
            n: tuple(u for u, unit in enumerate(model.units) if n in unit.param_names) for n in self.names
        }
        self.step = 0
        self.generation = generation
        mine = {n: s for n, s in (sparsity or {}).items() if n in self.users}
        shared = arena if storage_dir is None else None  # the store's arena: masks' indexes live there too
        self.sparse = SparseTensors(mine, {n: model.specs[n].shape for n in mine}, shared)
        try:
            if resume_dir is None:
                initial = (
                    start_tensors(init_dir, self.names)
                    if init_dir is not None
                    else ((n, init_tensor(model.specs[n], seed)) for n in self.names)
                )
                for n, w in initial:  # one tensor at a time, straight into the store
                    if w.shape != model.specs[n].shape:  # checked by the coordinator; holds if it changed
                        raise ValueError(f"{init_dir}: {n} has shape {w.shape}, not {model.specs[n].shape}")
                    if n in self.sparse:  # the mask: from (seed, name), or the loaded weights (topk)
                        w = self.sparse.make(n, w)
                    self.store.put(n, w)
                    for key in self.state_keys[n]:
                        self.store.zeros(key, w.shape)
            else:
                self._load(resume_dir)
        except BaseException:
            self.store.close()
            raise
        self._pending: dict[str, set[int]] = {n: set() for n in self.names}  # units whose gradient is in
        self._sq_sum: float | None = None  # of this step's gradients, once complete
        # Each tensor's sum of squares as its gradient completes (memory mode; the disk store reuses one
        # block buffer): the norm waits only for the last arrivals, not a pass over all (d768/L12: ~0.1 s)
        self._in_ram = isinstance(self.store, MemoryStore)
        self._norms = ThreadPoolExecutor(1, thread_name_prefix="memoryx-norm") if self._in_ram else None
        self._sq_parts: dict[str, Future[float]] = {}
        self._sums: dict[str, int] = {}  # checksums of the current weights: sent twice per step
        self._cond = threading.Condition()
        # While apply_update(step) runs (outside the lock, tensor by tensor): that step, and the tensors
        # already updated, which tensors(step + 1) may serve before the whole update is done.
        self._updating: int | None = None
        self._fresh: set[str] = set()
        self._closed = False
        self.served_early = 0  # tensors served that way (for tests and operators)
        # gradient memfds' mappings, kept as senders keep them (memory mode; ``reset`` drops them)
        self.grad_maps = MappingCache(2 * len(model.units) if arena is not None else 0)

    def _shape(self, name: str) -> tuple[int, ...]:
        """What the store holds of tensor ``name`` (and its gradient): compact if sparse."""
        return self.sparse.compact_shape(name) if name in self.sparse else self.model.specs[name].shape

    def _drop_gradients(self) -> None:
        for n in self.names:
            for u in self._pending[n]:
                self.store.drop(f"{n}.grad.{u}")
            if not self._in_ram:  # in RAM the sum's buffer is kept for the next step (_sum_gradient)
                self.store.drop(f"{n}.grad")
            self._pending[n] = set()
        self._sq_sum, self._sq_parts = None, {}  # a sum still running is for gradients no longer here

    def reset(self, generation: int) -> None:
        """Forget the gradients of the step in progress and accept only calls of ``generation`` from now
        on: the coordinator re-runs that step after a fault elsewhere. Weights and state stay."""
        with self._cond:
            self._idle()  # an update being applied completes first: a shard is never left half-updated
            self.generation = generation
            self._drop_gradients()
            self.grad_maps.close()
            self._cond.notify_all()  # waiters of the old generation wake up and give up

    def close(self) -> None:
        """Wake every call waiting here (they fail with ShardClosedError: a handler left waiting out its
        timeout would hold its stopping process alive), let an update being applied finish (its store is
        never freed under it), then free the store (disk mode: the files are scratch, checkpoints are the
        durable copy)."""
        if self._norms is not None:
            self._norms.shutdown(wait=False, cancel_futures=True)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._updating is None, timeout=self.timeout_s)
            self.grad_maps.close()
            self.store.close()

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """``wait_for(ready)`` under the lock, up to the timeout; raises if the shard closes meanwhile."""
        done = self._cond.wait_for(lambda: self._closed or ready(), timeout=self.timeout_s)
        if self._closed:
            raise ShardClosedError("this MemoryX shard was closed (its role is stopping or reconfigured)")
        return done

    # -- streaming out -------------------------------------------------------------------------------------
    def tensors(self, step: int, names: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """The weights after ``step`` updates. In memory mode the arrays are shared, not copied: they are
        only replaced in place after every reader of this step is done (the coordinator's ordering)."""
        missing = [n for n in names if n not in self.users]
        if missing:
            raise KeyError(f"tensors not on this shard: {missing}")
        with self._cond:
            if not self._wait(lambda: self._ready(step, names)):
                raise TimeoutError(
                    f"weights of step {step} not ready after {self.timeout_s}s (at {self.step})"
                )
            if self.step != step:
                if self.step > step:
                    raise StaleStepError(f"weights of step {step} requested, shard is at step {self.step}")
                self.served_early += len(names)  # updated already, the rest of the update still going
        return list(self._wire(names))  # disk: read outside the lock

    def _ready(self, step: int, names: Sequence[str]) -> bool:
        """Whether the weights of ``names`` after ``step`` updates can be served (under the lock)."""
        if self.step >= step:
            return True
        return self._updating == step - 1 and all(n in self._fresh for n in names)

    def _idle(self) -> None:
        """Wait (under the lock) until no update is being applied."""
        if not self._wait(lambda: self._updating is None):
            raise TimeoutError(f"the update of step {self._updating} still running after {self.timeout_s}s")

    def _wire(self, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
        for n in names:
            yield n, self.store.get(n)
            if n in self.sparse:  # the values alone mean nothing without their index
                yield self.sparse.index_tensor(n)

    @property
    def shares_weights(self) -> bool:
        """Whether the weights live in memfds (the shared-memory plane), so they are sent by reference."""
        return isinstance(self.store, MemoryStore) and self.store.arena is not None

    def weight(self, name: str) -> np.ndarray:
        """Tensor ``name`` as it is stored (compact if sparse: ``dense`` for the full tensor)."""
        return self.store.get(name)

    def dense(self, key: str) -> np.ndarray:
        """Weight or state buffer ``key`` in its dense shape (zeros at pruned entries)."""
        name = key if key in self.users else key.rsplit(".", 1)[0]
        value = self.store.get(key)
        return self.sparse.dense(name, value) if name in self.sparse else value

    def state(self, name: str) -> dict[str, np.ndarray]:
        """The optimizer state buffers of tensor ``name``, by torch's names (as stored)."""
        return {key.rsplit(".", 1)[1]: self.store.get(key) for key in self.state_keys[name]}

    def checksums(self, tensors: Sequence[tuple[str, np.ndarray]]) -> dict[str, int]:
        """XXH3-64 checksums of ``tensors`` (as ``tensors()`` returned them), cached until the next update."""
        with self._cond:
            missing = [(n, t) for n, t in tensors if n not in self._sums]
        fresh = {n: checksum(t.reshape(-1).view(np.uint8)) for n, t in missing}
        with self._cond:
            self._sums.update(fresh)
            return {n: self._sums[n] for n, _ in tensors}

    # -- gradients in --------------------------------------------------------------------------------------
    def add_gradient(
        self, step: int, unit: int, grads: Mapping[str, np.ndarray], generation: int = 0
    ) -> None:
        with self._cond:
            self._idle()  # a gradient of the next step can arrive before the update's last bookkeeping
            check_generation(generation, self.generation, f"gradient of unit {unit} for step {step}")
            if step != self.step:
                raise StaleStepError(f"gradient of step {step} for unit {unit}, shard is at step {self.step}")
            for name, g in grads.items():
                if name not in self._pending:
                    raise KeyError(f"gradient for {name!r}, which this shard does not hold")
                if unit not in self.users[name]:
                    raise ValueError(f"unit {unit} does not use {name!r}")
                if unit in self._pending[name]:
                    raise ValueError(f"gradient of {name!r} from unit {unit} arrived twice in step {step}")
                if g.shape != self._shape(name):
                    raise ValueError(
                        f"gradient of {name!r} has shape {g.shape}, expected {self._shape(name)}"
                    )
            for name, g in grads.items():
                self.store.put(f"{name}.grad.{unit}", g.astype(np.float32, copy=False))
                self._pending[name].add(unit)
                if self._norms is not None and len(self._pending[name]) == len(self.users[name]):
                    self._sq_parts[name] = self._norms.submit(self._eager_sum(name))  # complete: now
            self._cond.notify_all()

    def _eager_sum(self, n: str) -> Callable[[], float]:
        """Tensor ``n``'s complete gradient's sum of squares, to run in the background (memory mode; under
        the lock): a tied tensor's parts are added first (``grad_sums.background_sum``)."""
        parts = [f"{n}.grad.{u}" for u in self.users[n]]  # unit order
        return grad_sums.background_sum(self.store, parts, self._sum_buffer(n) if len(parts) > 1 else None)

    def _sum_buffer(self, n: str) -> str:
        """The key of tied tensor ``n``'s sum; in RAM kept from step to step (``_drop_gradients``)."""
        key = self._grad_key(n)
        if self.store.shapes.get(key) != self._shape(n):
            self.store.zeros(key, self._shape(n))
        return key

    def _complete(self) -> bool:
        return all(len(self._pending[n]) == len(self.users[n]) for n in self.names)

    def _grad_key(self, n: str) -> str:
        """Where tensor ``n``'s whole gradient is once summed: its one unit's part, or ``<n>.grad``."""
        users = self.users[n]
        return f"{n}.grad.{users[0]}" if len(users) == 1 else f"{n}.grad"

    def _sum_gradient(self, n: str) -> str:
        """The key of tensor ``n``'s whole gradient: its one part, or the parts added in unit order."""
        parts = [f"{n}.grad.{u}" for u in self.users[n]]  # unit order, not arrival order
        if len(parts) == 1:
            return self._grad_key(n)
        key = self._sum_buffer(n)
        self.store.update([key, *parts], grad_sums.add_parts, write=[key])
        for p in parts:
            self.store.drop(p)
        return key

    def grad_sq_sum(self, step: int, generation: int = 0) -> float:
        with self._cond:
            check_generation(generation, self.generation, f"norm of step {step}")
            if step != self.step:
                raise StaleStepError(f"norm of step {step} requested, shard is at step {self.step}")
            if self._sq_sum is None:
                done = self._wait(lambda: self.generation != generation or self._complete())
                check_generation(generation, self.generation, f"norm of step {step}")
                if not done:
                    missing = {
                        n: sorted(set(self.users[n]) - self._pending[n])
                        for n in self.names
                        if len(self._pending[n]) < len(self.users[n])
                    }
                    raise TimeoutError(
                        f"step {step}: gradients still missing after {self.timeout_s}s "
                        f"(tensor: units) {missing}"
                    )
                total = 0.0
                for n in self.names:
                    part = self._sq_parts.get(n)
                    if part is not None:
                        total += part.result()
                        for u in self.users[n] if len(self.users[n]) > 1 else ():  # summed: let go
                            self.store.drop(f"{n}.grad.{u}")
                    else:
                        total += grad_sums.sq_sum_of(self.store.blocks(self._sum_gradient(n)))
                self._sq_sum = total
            return self._sq_sum

    def apply_update(self, step: int, lr: float, clip_coef: float, generation: int = 0) -> bool:
        """Apply the optimizer for ``step``. Returns False if it was applied already.

        Tensor by tensor in the model's order (the embedding first) and outside the lock, so that
        ``tensors(step + 1)`` serves each one as soon as it is updated; gradients of the next step,
        ``reset`` and checkpoints wait for the whole update. Where masks are made again after this step
        (dynamic sparsity) nothing is served before the end."""
        if step == self.step:
            self.grad_sq_sum(step, generation)  # waits until every gradient is in, and sums them
        with self._cond:
            self._idle()  # the same step asked twice at once: the second finds it applied
            check_generation(generation, self.generation, f"update of step {step}")
            if step < self.step:
                return False
            if step > self.step or self._sq_sum is None:
                raise StaleStepError(f"update of step {step} requested, shard is at step {self.step}")
            self._updating, self._fresh = step, set()
            remask = self.sparse.due(step + 1)
        try:
            names = state_names(self.opt.kind)
            for n in self.names:
                grad = self._grad_key(n)

                # the first unit's tensors on both cores (memory mode: the norm thread, idle now): the next
                # step's workers wait for them
                helper = self._norms if 0 in self.users[n] else None
                wd = self.opt.weight_decay_for(n)
                kw = {"step": step + 1, "lr": lr, "scale": clip_coef, "weight_decay": wd, "helper": helper}
                update = partial(update_blocks, self.opt, names, **kw)

                # block by block: weight, gradient and state in, weight and state back
                self.store.update([n, grad, *self.state_keys[n]], update, write=[n, *self.state_keys[n]])
                if not remask:
                    with self._cond:
                        self._sums.pop(n, None)
                        self._fresh.add(n)
                        self._cond.notify_all()
            for n in remask:  # dynamic sparsity: masks made again from these weights
                keys = [n, *self.state_keys[n]]
                compact = self.sparse.remask(n, step + 1, [self.store.get(k) for k in keys])
                for key, v in zip(keys, compact, strict=True):
                    self.store.put(key, v)
            with self._cond:
                self._drop_gradients()
                if remask:
                    self._sums = {}
                self.step += 1
        finally:
            with self._cond:
                self._updating, self._fresh = None, set()
                self._cond.notify_all()
        if isinstance(self.store, DiskStore):  # what a step cost the disk, for operators and benches
            st = self.store
            log.info(
                "step %d applied: disk read %d B, written %d B, %.3f s in I/O (totals), %d B on disk",
                step + 1,
                st.bytes_read,
                st.bytes_written,
                st.io_seconds,
                st.disk_bytes(),
            )
        return True

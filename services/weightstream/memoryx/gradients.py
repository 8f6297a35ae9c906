"""The gradients of the step a MemoryX shard is in: which units' have arrived, each tensor's whole gradient
(a tied tensor's parts added in unit order, never arrival order) and their sum of squares for clipping.

In a resident store (RAM) each tensor's sum of squares starts on a background thread as soon as its
gradient is complete, so the norm at the end of the step waits only for the last arrivals, not a pass
over all (d768/L12: ~0.1 s); the same thread is the optimizer's second core while an update runs (idle
then). On disk every sum is taken when the norm is asked, through the store's block buffers. Either way
the arithmetic is ``grad_sums``', so the bits do not depend on where or when it ran.

Not locked: the shard calls it under its lock (``ShardProgress``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from weightstream.memoryx import grad_sums
from weightstream.memoryx.state import ShardState

__all__ = ["StepGradients"]


class StepGradients:
    def __init__(self, state: ShardState) -> None:
        self.state = state
        self.pending: dict[str, set[int]] = {n: set() for n in state.names}  # units whose gradient is in
        self.sq_sum: float | None = None  # of this step's gradients, once complete
        # the tensors' sums of squares running or done in the background (a resident store only)
        self.background = (
            ThreadPoolExecutor(1, thread_name_prefix="memoryx-norm") if state.store.resident else None
        )
        self.sq_parts: dict[str, Future[float]] = {}

    def add(self, step: int, unit: int, grads: Mapping[str, np.ndarray]) -> None:
        """Store unit ``unit``'s gradients of this step (``step``: for messages), all or none: ValueError
        or KeyError names the first one that is not this shard's, not the unit's, twice, or misshapen."""
        users, shape = self.state.users, self.state.shape
        for name, g in grads.items():
            if name not in self.pending:
                raise KeyError(f"gradient for {name!r}, which this shard does not hold")
            if unit not in users[name]:
                raise ValueError(f"unit {unit} does not use {name!r}")
            if unit in self.pending[name]:
                raise ValueError(f"gradient of {name!r} from unit {unit} arrived twice in step {step}")
            if g.shape != shape(name):
                raise ValueError(f"gradient of {name!r} has shape {g.shape}, expected {shape(name)}")
        for name, g in grads.items():
            self.state.store.put(f"{name}.grad.{unit}", g.astype(np.float32, copy=False))
            self.pending[name].add(unit)
            if self.background is not None and len(self.pending[name]) == len(users[name]):
                self.sq_parts[name] = self.background.submit(self._eager_sum(name))  # complete: now

    def complete(self) -> bool:
        """Whether every unit's gradient of every tensor is in."""
        return all(len(self.pending[n]) == len(self.state.users[n]) for n in self.state.names)

    def missing(self) -> dict[str, list[int]]:
        """The units whose gradient has not arrived, by tensor (those with any missing)."""
        users = self.state.users
        return {
            n: sorted(set(users[n]) - self.pending[n]) for n in users if len(self.pending[n]) < len(users[n])
        }

    def total(self) -> float:
        """The complete gradients' sum of squares, tensor by tensor in the shard's order (float64): from
        the background where it ran (its parts let go), else summed now; kept as ``sq_sum``."""
        store, users = self.state.store, self.state.users
        total = 0.0
        for n in self.state.names:
            part = self.sq_parts.get(n)
            if part is not None:
                total += part.result()
                for u in users[n] if len(users[n]) > 1 else ():  # summed: let go
                    store.drop(f"{n}.grad.{u}")
            else:
                total += grad_sums.sq_sum_of(store.blocks(self._sum_gradient(n)))
        self.sq_sum = total
        return total

    def key(self, n: str) -> str:
        """Where tensor ``n``'s whole gradient is once summed: its one unit's part, or ``<n>.grad``."""
        users = self.state.users[n]
        return f"{n}.grad.{users[0]}" if len(users) == 1 else f"{n}.grad"

    def drop(self) -> None:
        """Forget this step's gradients (applied, or of an interrupted attempt)."""
        store = self.state.store
        for n in self.state.names:
            for u in self.pending[n]:
                store.drop(f"{n}.grad.{u}")
            store.recycle(f"{n}.grad")  # a tied tensor's sum: wanted again next step (_sum_buffer)
            self.pending[n] = set()
        self.sq_sum, self.sq_parts = None, {}  # a sum still running is for gradients no longer here

    def close(self) -> None:
        """Stop the background thread (a sum not started is dropped; one running finishes on its own)."""
        if self.background is not None:
            self.background.shutdown(wait=False, cancel_futures=True)

    def _eager_sum(self, n: str) -> Callable[[], float]:
        """Tensor ``n``'s complete gradient's sum of squares, to run in the background (a resident store):
        a tied tensor's parts are added first (``grad_sums.background_sum``)."""
        parts = [f"{n}.grad.{u}" for u in self.state.users[n]]  # unit order
        return grad_sums.background_sum(
            self.state.store, parts, self._sum_buffer(n) if len(parts) > 1 else None
        )

    def _sum_buffer(self, n: str) -> str:
        """The key of tied tensor ``n``'s sum; in RAM kept from step to step (``drop``)."""
        key, shape = self.key(n), self.state.shape(n)
        if self.state.store.shapes.get(key) != shape:
            self.state.store.zeros(key, shape)
        return key

    def _sum_gradient(self, n: str) -> str:
        """The key of tensor ``n``'s whole gradient: its one part, or the parts added in unit order."""
        parts = [f"{n}.grad.{u}" for u in self.state.users[n]]  # unit order, not arrival order
        if len(parts) == 1:
            return self.key(n)
        key = self._sum_buffer(n)
        self.state.store.update([key, *parts], grad_sums.add_parts, write=[key])
        for p in parts:
            self.state.store.drop(p)
        return key

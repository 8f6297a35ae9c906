"""A MemoryX shard's weights going out: ``tensors(step, names)`` and their checksums.

A request for the weights after ``step`` updates waits until they are. While the update of ``step - 1``
is being applied (tensor by tensor, the embedding first), a tensor it has finished is served at once, so
the workers' next forward overlaps the rest of the update (``served_early`` counts those). A sparse
tensor travels as its kept values plus its index (``memoryx.sparse``). Checksums are sent with every
weight, twice a step (forward and backward), so each is computed once per update and cached.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from weightstream.memoryx.errors import StaleStepError
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.state import ShardState
from weightstream.transport.tensors import checksum

__all__ = ["ChecksumCache", "WeightServing"]


class ChecksumCache:
    """XXH3-64 checksums of the current weights by name; an update ``forget``s those it changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, int] = {}

    def of(self, tensors: Sequence[tuple[str, np.ndarray]]) -> dict[str, int]:
        """The checksum of each of ``tensors`` (name, array), computed (outside the lock) if not cached."""
        with self._lock:
            missing = [(n, t) for n, t in tensors if n not in self._sums]
        fresh = {n: checksum(t.reshape(-1).view(np.uint8)) for n, t in missing}
        with self._lock:
            self._sums.update(fresh)
            return {n: self._sums[n] for n, _ in tensors}

    def forget(self, name: str) -> None:
        with self._lock:
            self._sums.pop(name, None)

    def clear(self) -> None:
        with self._lock:
            self._sums = {}


class WeightServing:
    def __init__(self, state: ShardState, progress: ShardProgress) -> None:
        self.state, self.progress = state, progress
        self.checksums = ChecksumCache()
        self.served_early = 0  # tensors served while their update's step was still running

    def tensors(self, step: int, names: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """The weights after ``step`` updates (with each sparse tensor's index after its values). In
        memory mode the arrays are shared, not copied: they are only replaced in place after every reader
        of this step is done (the coordinator's ordering). KeyError for a tensor of another shard,
        StaleStepError for a step passed, TimeoutError if not ready within the shard's timeout."""
        missing = [n for n in names if n not in self.state.users]
        if missing:
            raise KeyError(f"tensors not on this shard: {missing}")
        progress = self.progress
        with progress:
            if not progress.wait(lambda: self.ready(step, names)):
                raise TimeoutError(
                    f"weights of step {step} not ready after {progress.timeout_s}s (at {progress.step})"
                )
            if progress.step != step:
                if progress.step > step:
                    raise StaleStepError(
                        f"weights of step {step} requested, shard is at step {progress.step}"
                    )
                self.served_early += len(names)  # updated already, the rest of the update still going
        return list(self._wire(names))  # disk: read outside the lock

    def ready(self, step: int, names: Sequence[str]) -> bool:
        """Whether the weights of ``names`` after ``step`` updates can be served (under the lock)."""
        progress = self.progress
        if progress.step >= step:
            return True
        return progress.updating == step - 1 and all(n in progress.fresh for n in names)

    def _wire(self, names: Sequence[str]) -> Iterator[tuple[str, np.ndarray]]:
        sparse = self.state.sparse
        for n in names:
            yield n, self.state.store.get(n)
            if n in sparse:  # the values alone mean nothing without their index
                yield sparse.index_tensor(n)

    @property
    def shares_weights(self) -> bool:
        """Whether the weights live in memfds (the shared-memory plane), so they are sent by reference."""
        return self.state.store.arena is not None

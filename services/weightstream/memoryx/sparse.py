"""A MemoryX shard's sparse tensors: their masks, and the conversions between compact and dense.

A sparse tensor lives in the shard's store *compact*: its kept values only, 1-D, in ascending position
order, and so do its optimizer state and its gradients. The optimizer then runs over kept entries alone:
a pruned weight has no value, no state and no gradient to update, so it is zero, and its state is zero,
for the whole run by construction (and the optimizer does a density's share of the work). Dense form
exists only at the edges: when the mask is made or loaded (or made again by gmp, one tensor at a time),
and when a checkpoint is written (ordinary dense safetensors with zeros, which Hugging Face loads as they
are, plus the masks in a file of their own).

The masks are held in RAM in their wire encoding (``transport.sparse``: a bitmask or delta bytes, at most
one bit per entry), never as positions, so a disk-mode shard's resident memory grows by at most 1/32 of
its fp32 weights. With a shared-memory arena the encoding lives in a memfd, and co-located workers map it
like the weights themselves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from weightstream.memoryx.store import BLOCK_ELEMENTS
from weightstream.numerics.sparse_masks import SparsitySpec, make_positions
from weightstream.numerics.sparsity_schedule import largest_positions
from weightstream.transport.shm import SharedArena
from weightstream.transport.sparse import decode_index, encode_index, index_name

__all__ = ["SparseTensors"]


class SparseTensors:
    def __init__(
        self,
        specs: Mapping[str, SparsitySpec],
        shapes: Mapping[str, tuple[int, ...]],
        arena: SharedArena | None = None,
    ) -> None:
        """``specs``: the shard's sparse tensors; ``shapes``: their dense shapes."""
        self.specs, self.shapes, self.arena = dict(specs), {n: shapes[n] for n in specs}, arena
        self._index: dict[str, tuple[str, np.ndarray]] = {}  # name -> (kind, encoded positions)
        self.nnz: dict[str, int] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.specs

    def __len__(self) -> int:
        return len(self.specs)

    def numel(self, name: str) -> int:
        return int(np.prod(self.shapes[name], dtype=np.int64))

    # -- masks ---------------------------------------------------------------------------------------------
    def make(self, name: str, weight: np.ndarray) -> np.ndarray:
        """Make ``name``'s mask from its spec (and, for the magnitude methods, ``weight``); return the
        weight compacted to it."""
        self._set(name, make_positions(name, self.shapes[name], self.specs[name], weight))
        return self.compact(name, weight)

    def load_mask(self, name: str, mask: np.ndarray) -> None:
        """Take ``name``'s mask from a checkpoint (bool, its dense shape)."""
        if mask.shape != self.shapes[name]:
            raise ValueError(f"mask of {name!r} has shape {mask.shape}, the tensor {self.shapes[name]}")
        self._set(name, np.flatnonzero(mask.reshape(-1)))

    def _set(self, name: str, positions: np.ndarray) -> None:
        kind, data = encode_index(positions, self.numel(name))
        if self.arena is not None and data.nbytes:
            shared = self.arena.empty(data.shape, np.uint8)
            shared[...] = data
            data = shared
        old = self._index.get(name)
        if old is not None and self.arena is not None:
            self.arena.release(old[1])  # a dynamic mask made again: its last index goes
        self._index[name] = (kind, data)
        self.nnz[name] = len(positions)

    def due(self, step: int) -> list[str]:
        """The dynamic tensors whose masks are made again after update ``step`` (1-based)."""
        return [n for n, spec in self.specs.items() if spec.due(step)]

    def remask(self, name: str, step: int, buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Make ``name``'s mask again after update ``step`` (gmp: the entries of largest magnitude of the
        weight, as many as the level at ``step`` keeps) and return ``buffers`` (the compact weight first,
        then its optimizer state) compacted to it: kept entries keep their values, entries pruned now are
        dropped with their state, entries kept again (a falling level) start at zero, state included."""
        dense = [self.dense(name, b) for b in buffers]
        kept = self.specs[name].kept_at(self.numel(name), step)
        self._set(name, largest_positions(dense[0], kept))
        return [self.compact(name, d) for d in dense]

    def positions(self, name: str) -> np.ndarray:
        kind, data = self._index[name]
        return decode_index(name, kind, data, self.numel(name), self.nnz[name])

    def index_tensor(self, name: str) -> tuple[str, np.ndarray]:
        """(wire name, bytes) of ``name``'s index: what travels beside its values."""
        kind, data = self._index[name]
        return index_name(name, kind), data

    # -- compact <-> dense ---------------------------------------------------------------------------------
    def compact_shape(self, name: str) -> tuple[int, ...]:
        return (self.nnz[name],)

    def compact(self, name: str, dense: np.ndarray) -> np.ndarray:
        """The kept entries of ``dense`` (its dense shape), 1-D: what the store holds."""
        return np.ascontiguousarray(dense.reshape(-1)[self.positions(name)], dtype=np.float32)

    def dense(self, name: str, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.numel(name), dtype=np.float32)
        out[self.positions(name)] = values
        return out.reshape(self.shapes[name])

    def dense_blocks(self, name: str, values: np.ndarray) -> Iterator[np.ndarray]:
        """``values`` scattered into the dense tensor, flat, in blocks of ``BLOCK_ELEMENTS`` (zeros
        elsewhere): a checkpoint file's bytes of the tensor, one block in memory at a time."""
        return self._scattered(name, values, np.float32)

    def mask_blocks(self, name: str) -> Iterator[np.ndarray]:
        """The mask (True = kept), flat, in blocks of ``BLOCK_ELEMENTS``."""
        return self._scattered(name, np.True_, np.bool_)

    def _scattered(self, name: str, values: np.ndarray | np.bool_, dtype: type) -> Iterator[np.ndarray]:
        """``values`` (one per kept entry, or one for all) at their positions, zeros elsewhere, in blocks
        (one buffer, reused: each block is written out before the next is made)."""
        positions = self.positions(name)
        numel = self.numel(name)
        block: np.ndarray = np.empty(min(numel, BLOCK_ELEMENTS), dtype=dtype)
        for start in range(0, numel, BLOCK_ELEMENTS):
            out = block[: min(BLOCK_ELEMENTS, numel - start)]
            lo, hi = np.searchsorted(positions, [start, start + len(out)])
            out[...] = 0
            out[positions[lo:hi] - start] = values[lo:hi] if isinstance(values, np.ndarray) else values
            yield out

    def density(self) -> float:
        """Kept entries over all entries of this shard's sparse tensors."""
        total = sum(self.numel(n) for n in self.specs)
        return sum(self.nnz.values()) / total if total else 1.0

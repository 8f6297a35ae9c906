"""Sparse weights as they arrive at a worker: values plus index in, ``SparseWeight`` out.

The index of a tensor does not change while its mask does not (static masks never do; gmp's change at its
update steps), so the structure derived from it (positions, row pointers, columns) is built once per mask
and reused: only the values, which change every step, are new in each unit. A changed index (a gmp mask
made again, or a rerun from a different checkpoint on a long-lived worker) is noticed by its checksum and
rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from weightstream.numerics import ModelDef
from weightstream.numerics.sparse import SparseWeight
from weightstream.transport.errors import ProtocolError
from weightstream.transport.sparse import decode_index, split_index
from weightstream.transport.tensors import checksum

__all__ = ["SparseAssembler"]


class SparseAssembler:
    def __init__(self, model: ModelDef) -> None:
        self.model = model
        self._structure: dict[str, tuple[tuple[str, int], SparseWeight]] = {}  # name -> (index key, weight)

    def __call__(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | SparseWeight]:
        """A unit's tensors as received -> what its forward and backward take (sparse weights as
        ``SparseWeight``, every other tensor as it came)."""
        plain, indexes = split_index(tensors)
        out: dict[str, np.ndarray | SparseWeight] = dict(plain)
        for name, (kind, data) in indexes.items():
            spec = self.model.specs.get(name)
            if spec is None or name not in self.model.sparse_candidates:
                raise ProtocolError(f"sparse index for {name!r}, which cannot be a sparse weight")
            values = plain[name]
            if values.ndim != 1:
                raise ProtocolError(f"{name}: sparse values must be 1-D (got shape {values.shape})")
            key = (kind, checksum(np.ascontiguousarray(data).view(np.uint8)))
            cached = self._structure.get(name)
            if cached is not None and cached[0] == key and cached[1].nnz == len(values):
                out[name] = cached[1].with_values(values)
                continue
            positions = decode_index(name, kind, data, spec.numel, len(values))
            shape = spec.shape
            weight = SparseWeight.from_positions((shape[0], shape[1]), positions, values)
            self._structure[name] = (key, weight)
            out[name] = weight
        return out

"""Which entries of a sparse weight are kept: its mask, made once, deterministically, by MemoryX.

A mask is a function of (seed, the tensor's name, its shape, its sparsity, the method) and, for the
magnitude methods, of the tensor's initial values, which are themselves a function of (seed, name). So
every shard, at any node count, makes exactly the same masks without talking to anyone, and a rerun
makes them again bit for bit. Masks are kept as ``positions``: the flat row-major indices of the kept
entries, ascending (the order the compressed values travel and are stored in).

Methods (ModelZoo's ``init_method`` names), on the tensor as stored in the checkpoint ([R, C]):

- ``random``: a uniformly random set of exactly ``kept`` entries;
- ``topk``: the ``kept`` entries of largest magnitude (ties: the lower position wins);
- ``balanced-topk``: the same number of entries in every row, each row's largest (so no row is starved);
- ``checkerboard``: evenly spaced entries, each row's pattern shifted by one column against the last, so
  kept entries never line up in columns.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, get_args

import numpy as np

from weightstream.numerics.sparsity_schedule import LevelSchedule, UpdateSchedule, gmp_kept, largest_positions

__all__ = ["INIT_METHODS", "InitMethod", "SparsitySpec", "kept_count", "kept_entries", "make_positions"]

InitMethod = Literal["random", "topk", "balanced-topk", "checkerboard"]
INIT_METHODS: tuple[str, ...] = get_args(InitMethod)  # the Literal's values, in order
_MASK_STREAM = 0x6D61736B  # "mask": keeps the random method's stream apart from the weights' own


@dataclass(frozen=True)
class SparsitySpec:
    """How one tensor is sparse: the fraction of zeros, and how the kept entries are chosen. With a
    ``schedule`` (``algorithm: gmp``) the mask is made again at the ``update`` steps (sparsity_schedule.py),
    and ``sparsity`` is the level the run starts at (0.0: dense until the first update)."""

    sparsity: float  # in [0, 1); with a schedule in [0, 1]
    init_method: InitMethod = "random"
    seed: int = 0
    schedule: LevelSchedule | None = None
    update: UpdateSchedule | None = None

    def __post_init__(self) -> None:
        # also refuses NaN; a static mask keeps something, a scheduled level may reach 1
        if not (0.0 <= self.sparsity <= 1.0 if self.dynamic else 0.0 <= self.sparsity < 1.0):
            bounds = "[0, 1]" if self.dynamic else "[0, 1)"
            raise ValueError(f"sparsity must be in {bounds} (got {self.sparsity!r})")
        if self.init_method not in INIT_METHODS:
            raise ValueError(f"init_method must be one of {INIT_METHODS} (got {self.init_method!r})")
        if (self.schedule is None) != (self.update is None):
            raise ValueError("a dynamic sparsity spec needs both a level schedule and an update schedule")

    @property
    def dynamic(self) -> bool:
        return self.schedule is not None

    def due(self, step: int) -> bool:
        """Whether the mask is made again after update ``step`` (1-based)."""
        return self.update is not None and self.update.is_update(step)

    def kept_at(self, numel: int, step: int) -> int:
        """Entries kept of ``numel`` by the mask made at update ``step`` (a dynamic spec)."""
        assert self.schedule is not None
        return gmp_kept(numel, self.schedule.at(step))


def kept_count(numel: int, sparsity: float) -> int:
    """Entries kept out of ``numel``: the zeros are ``ceil(sparsity * numel)``, computed on the decimal
    the user wrote (0.9 is 9/10, not the float just below it), so at most a ``1 - sparsity`` share is
    non-zero: 0.9 of 1000 keeps 100, of 65536 keeps 6553."""
    return numel - math.ceil(Fraction(repr(sparsity)) * numel)


def kept_entries(shape: tuple[int, ...], spec: SparsitySpec) -> int:
    """How many entries ``make_positions`` keeps of a tensor of ``shape``: balanced-topk counts per row. A
    dynamic spec's first mask counts as its later ones do (``gmp_kept``, float32)."""
    rows, cols = shape
    count = gmp_kept if spec.dynamic else kept_count
    if spec.init_method == "balanced-topk":
        return rows * count(cols, spec.sparsity)
    return count(rows * cols, spec.sparsity)


def make_positions(name: str, shape: tuple[int, ...], spec: SparsitySpec, weight: np.ndarray) -> np.ndarray:
    """The kept entries of tensor ``name`` [R, C] as ascending flat indices (int64). ``weight`` is the
    tensor's value when the mask is made (the magnitude methods rank it; the others ignore it)."""
    if len(shape) != 2:
        raise ValueError(f"{name}: only 2-D weights can be sparse (shape {shape})")
    rows, cols = shape
    numel = rows * cols
    method = spec.init_method
    if method == "balanced-topk":
        per_row = kept_entries((1, cols), spec)
        mag = np.abs(weight.reshape(rows, cols))
        # stable sort of -|w| in each row: the largest first, ties by column
        keep = np.argsort(-mag, axis=1, kind="stable")[:, :per_row]  # [R, per_row]
        out = (np.arange(rows, dtype=np.int64)[:, None] * cols + keep).reshape(-1)
        return np.sort(out)
    kept = kept_entries(shape, spec)
    if method == "random":
        rng = np.random.default_rng([spec.seed, zlib.crc32(name.encode()), _MASK_STREAM])
        return np.sort(rng.permutation(numel)[:kept].astype(np.int64))
    if method == "topk":
        return largest_positions(weight, kept)
    # checkerboard: ``kept`` evenly spaced slots q in [0, numel); slot q is row q // C at column
    # (q % C - row) mod C, i.e. each row's pattern rotated one column further than the last
    q = np.arange(kept, dtype=np.int64) * numel // max(kept, 1)
    r = q // cols
    c = (q % cols - r) % cols
    return np.sort(r * cols + c)

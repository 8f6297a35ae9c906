"""What every data processor shares: the base class that defines a step's global batch and a worker's
shard, the error a processor raises, and the two input-section helpers the file readers all use (which
files a ``data_dir`` holds, and ``drop_last``'s per-processor default).

Kept apart from ``processors.py`` so the HDF5 reader and its sequence-length probe build on it without
importing the module that chooses among processors (which imports them in turn).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from weightstream.params.schema import InputParams

__all__ = ["Batch", "DataError", "DataProcessor", "data_files", "drop_last_of"]

Batch = tuple[np.ndarray, np.ndarray]  # (inputs, targets); a target of -1 is ignored by the loss


class DataError(ValueError):
    """Training data that cannot be used (missing files, bad token ids, too little data). Permanent.
    ``key`` is the input section's key a user changes to fix it (``data_dir`` unless said otherwise)."""

    def __init__(self, message: str, key: str = "data_dir") -> None:
        super().__init__(message)
        self.key = key


class DataProcessor(ABC):
    # target tokens of one sample: T for a language model, 1 for a classifier (see ``global_tokens``)
    targets_per_sample: int = 1

    def __init__(self, batch_size: int, seed: int, shuffle: bool, drop_last: bool = False) -> None:
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last

    @property
    @abstractmethod
    def num_samples(self) -> int | None:
        """Samples in one epoch, or None for an endless generator."""

    @abstractmethod
    def samples(self, indices: np.ndarray) -> Batch:
        """The samples with these ids (as ``sample_indices`` gives them), stacked."""

    def batches_per_epoch(self) -> int | None:
        """Whole batches in one epoch when ``drop_last`` (None otherwise, or for an endless generator).
        A DataError when there are fewer samples than one batch, so a job fails before its first step."""
        n = self.num_samples
        if not self.drop_last or n is None:
            return None
        if n < self.batch_size:
            raise DataError(
                f"drop_last leaves no batch: batch_size {self.batch_size} is more than the "
                f"{n} samples of one epoch",
                key="batch_size",
            )
        return n // self.batch_size

    def epoch_positions(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, index within that epoch) of each of the ``batch_size`` samples of step ``step``.

        drop_last: step s is batch s % k of epoch s // k (k whole batches per epoch) and the last
        n - k * batch_size samples of each epoch's order are skipped. Otherwise the samples run on
        across epochs, so a batch may take the end of one epoch and the start of the next. Each epoch
        is a permutation seeded with (seed, epoch) when ``shuffle``; skipping the remainder does not
        change any epoch's permutation."""
        bs, n = self.batch_size, self.num_samples
        per_epoch = self.batches_per_epoch()
        if per_epoch is not None:
            epoch, b = divmod(step, per_epoch)
            order = np.arange(b * bs, (b + 1) * bs, dtype=np.int64)  # [bs] positions in the epoch's order
            epochs = np.full(bs, epoch, dtype=np.int64)
        else:
            ids = np.arange(step * bs, (step + 1) * bs, dtype=np.int64)
            if n is None:
                return np.zeros_like(ids), ids
            epochs, order = np.divmod(ids, n)
        if not self.shuffle:
            return epochs, order
        assert n is not None
        out = np.empty_like(order)
        for e in np.unique(epochs):
            perm = np.random.default_rng([self.seed, int(e)]).permutation(n)
            out[epochs == e] = perm[order[epochs == e]]
        return epochs, out

    def sample_indices(self, step: int) -> np.ndarray:
        """Sample ids of step ``step`` (what ``samples`` takes): epoch-local indices here; a processor
        whose samples differ from epoch to epoch (an HDF5 mixture) encodes the epoch as well."""
        return self.epoch_positions(step)[1]

    def global_tokens(self, step: int) -> int:
        """Counted targets (not -1) of step ``step``'s global batch: the loss's denominator on every
        worker. Without padding it is batch_size * targets_per_sample and reads nothing."""
        return self.batch_size * self.targets_per_sample

    def global_batch(self, step: int) -> Batch:
        return self.samples(self.sample_indices(step))

    def shard(self, step: int, worker: int, num_workers: int) -> Batch:
        """Worker ``worker``'s contiguous slice of the global batch of ``step``."""
        if self.batch_size % num_workers:
            raise DataError(f"batch_size {self.batch_size} is not divisible by {num_workers} workers")
        per = self.batch_size // num_workers
        return self.samples(self.sample_indices(step)[worker * per : (worker + 1) * per])


def drop_last_of(inp: InputParams) -> bool:
    """``drop_last`` as set, or its default: true for GptHDF5MapDataProcessor (as ModelZoo), else false."""
    if inp.drop_last is not None:
        return inp.drop_last
    return inp.data_processor == "GptHDF5MapDataProcessor"


def data_files(data_dir: str | list[str], pattern: str, what: str) -> list[Path]:
    """The files matching ``pattern`` in ``data_dir`` (one directory or a list), each directory's sorted
    by name, in the order the directories are given. A DataError naming the reader (``what``) when a
    directory is missing or none of them holds such a file."""
    dirs = [data_dir] if isinstance(data_dir, str) else data_dir
    files: list[Path] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise DataError(f"data_dir {str(d)!r} is not a directory")
        files += sorted(d.glob(pattern))
    if not files:
        raise DataError(f"no {pattern} files in data_dir {dirs!r} ({what} reads {pattern})")
    return files

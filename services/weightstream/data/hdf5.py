"""ModelZoo's GPT HDF5 input (``GptHDF5MapDataProcessor``): pre-tokenized samples with padding masks.

Each ``*.h5`` file (as ``cszoo data_preprocess`` and ``weightstream data-preprocess`` write them) holds a
dataset ``data`` of shape [n, 3, T] (integers) and the file attribute ``n_examples`` = n:

    data[i, 0] input_ids       the model's input
    data[i, 1] attention_mask  1: a real token whose label counts, 0: padding
    data[i, 2] labels          the next token

A sample is (input_ids, targets) with targets = labels where the mask is 1 and -1 (ignored by the loss)
where it is 0. Files stay open and a step reads only its own rows, so a corpus larger than memory trains
as well as a small one.

``num_workers`` (reader threads) is accepted for ModelZoo's params but not needed: h5py runs every call
under one process-wide lock, so threads would not read in parallel, and a step's rows (a few hundred KB)
read in milliseconds against a step of seconds.

Mixture (``mixture: [{data_dir, weight}]``): one epoch has N = n_1 + ... + n_k samples (the datasets'
sizes added up), of which dataset i gives c_i, the largest-remainder rounding of N * w_i / sum(w), so the
shares are exact to one sample in N. Dataset i is read as an endless stream of its rows in order, pass
after pass (0, 1, ..., n_i - 1, 0, 1, ...), and epoch e takes positions [e * c_i, (e + 1) * c_i) of it:
a dataset with more weight than size repeats (whole passes, then the next part of one), one with less
moves on through its rows from epoch to epoch, so over many epochs every row of a dataset is used
equally often. The epoch's N samples are then shuffled (a permutation seeded with (shuffle_seed, epoch)),
and ``drop_last`` cuts them into whole batches as for every processor. Deterministic: the samples of a
step depend only on (step, shuffle_seed, the files).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np

from weightstream.data.base import Batch, DataError, DataProcessor, data_files, drop_last_of
from weightstream.data.sequence_length import sequence_length
from weightstream.params.schema import InputParams

__all__ = ["GptHDF5MapDataProcessor", "apportion"]

# Steps whose global count of counted tokens is kept: the N workers of one step ask within moments of
# each other (and a retried step asks again), so a few steps are plenty.
_CACHED_STEPS = 8
_INPUT_IDS, _MASK, _LABELS = 0, 1, 2  # rows of data[i]


def apportion(weights: list[float], total: int) -> np.ndarray:
    """Largest-remainder rounding: ``total`` split in proportion to ``weights`` (any positive numbers),
    as int64 counts that add up to ``total`` exactly; ties go to the earlier entry."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * total  # [k]
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")  # largest remainder first
    counts[order[:short]] += 1
    return counts


class _H5Dataset:
    """The ``data`` arrays of some .h5 files, read as one sequence of samples (files in the given order)."""

    def __init__(self, files: list[Path], seq_len: int, vocab_size: int) -> None:
        self.files, self.vocab_size = files, vocab_size
        self.arrays: list[h5py.Dataset] = []
        self._open: list[h5py.File] = []  # open for the processor's life: a step reads from each again
        sizes = []
        for path in files:
            try:
                f = h5py.File(path, "r")
            except OSError as e:
                raise DataError(f"{path}: not a readable HDF5 file ({e})") from e
            self._open.append(f)
            ds = f.get("data")
            if not isinstance(ds, h5py.Dataset):
                raise DataError(f"{path}: has no dataset 'data' (ModelZoo's GPT HDF5 layout: [n, 3, T])")
            if ds.ndim != 3 or ds.shape[1] != 3 or not np.issubdtype(ds.dtype, np.integer):
                raise DataError(
                    f"{path}: 'data' is {ds.dtype} of shape {list(ds.shape)}; expected integers of shape "
                    f"[n, 3, {seq_len}] (input_ids, attention_mask, labels)"
                )
            if ds.shape[2] != seq_len:
                raise DataError(
                    f"{path}: samples are {ds.shape[2]} tokens long, but max_sequence_length is {seq_len}"
                )
            n_examples = f.attrs.get("n_examples")
            if n_examples is not None and int(n_examples) != ds.shape[0]:
                raise DataError(
                    f"{path}: attribute n_examples={int(n_examples)} but 'data' holds {ds.shape[0]} samples"
                )
            self.arrays.append(ds)
            sizes.append(ds.shape[0])
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # [files + 1]
        self.n = int(self.starts[-1])

    def read(self, rows: np.ndarray, mask_only: bool = False) -> np.ndarray:
        """data[rows] [b, 3, T], or only the attention masks [b, T], for rows [b] (any order, repeats
        allowed) in the order of ``rows``, as int64. Reads those rows only, file by file (h5py's list
        selections must increase and not repeat); checks the token ids of what it reads."""
        file_of = np.searchsorted(self.starts, rows, side="right") - 1  # [b]
        out: np.ndarray | None = None
        for fi in np.unique(file_of):
            at = np.nonzero(file_of == fi)[0]  # positions in the batch
            local = rows[at] - self.starts[fi]
            uniq, inverse = np.unique(local, return_inverse=True)
            if mask_only:
                block = self.arrays[fi][uniq, _MASK]  # [u, T]
            else:
                block = self.arrays[fi][uniq]  # [u, 3, T]
                self._check_ids(fi, uniq, block)
            if out is None:
                out = np.empty((len(rows), *block.shape[1:]), dtype=np.int64)
            out[at] = block[inverse]
        assert out is not None
        return out

    def _check_ids(self, fi: int, uniq: np.ndarray, block: np.ndarray) -> None:
        """Every input id, and every label that counts, must be a token of the model's vocabulary."""
        ids, mask, labels = block[:, _INPUT_IDS], block[:, _MASK], block[:, _LABELS]  # [u, T] each
        bad_ids = (ids < 0) | (ids >= self.vocab_size)
        bad_labels = (mask != 0) & ((labels < 0) | (labels >= self.vocab_size))
        for what, bad, values in (("input id", bad_ids, ids), ("label", bad_labels, labels)):
            if bad.any():
                s, t = np.argwhere(bad)[0]
                raise DataError(
                    f"{self.files[fi]}: sample {int(uniq[s])}, position {int(t)}: {what} {int(values[s, t])} "
                    f"is out of range for model.vocab_size={self.vocab_size}"
                )


class GptHDF5MapDataProcessor(DataProcessor):
    """Samples of one HDF5 dataset (``data_dir``: a directory or a list of them) or of a weighted
    ``mixture`` of several. Sample ids (``sample_indices``) are epoch * N + position in the epoch, since a
    mixture's epochs differ (see the module's docstring)."""

    def __init__(self, inp: InputParams, vocab_size: int, seed: int) -> None:
        super().__init__(inp.batch_size, seed, inp.shuffle, drop_last_of(inp))
        # left out: the files' sample length (data/sequence_length.py; the coordinator fills it in first)
        seq_len = inp.max_sequence_length or sequence_length(inp)
        self.targets_per_sample = seq_len
        sources: list[tuple[str | list[str], float]]  # (data_dir, weight) of each dataset
        if inp.mixture is not None:
            sources = [(m.data_dir, m.weight) for m in inp.mixture]
        else:
            assert inp.data_dir is not None  # params/checks.py: data_dir or mixture
            sources = [(inp.data_dir, 1.0)]
        self.datasets: list[_H5Dataset] = []
        for data_dir, _ in sources:
            ds = _H5Dataset(data_files(data_dir, "*.h5", "GptHDF5MapDataProcessor"), seq_len, vocab_size)
            if ds.n == 0:
                raise DataError(f"data_dir {data_dir!r}: its .h5 files hold no samples")
            self.datasets.append(ds)
        self._n = sum(d.n for d in self.datasets)
        self.per_epoch = apportion([w for _, w in sources], self._n)  # [k] c_i: samples of each per epoch
        self._first = np.concatenate([[0], np.cumsum(self.per_epoch)])  # [k + 1] epoch positions
        self._counts: OrderedDict[int, int] = OrderedDict()  # step -> global counted tokens
        self._lock = threading.Lock()  # the activation server answers workers on several threads

    @property
    def num_samples(self) -> int:
        return self._n

    def sample_indices(self, step: int) -> np.ndarray:
        epochs, positions = self.epoch_positions(step)
        return epochs * self._n + positions  # [batch_size]

    def _locate(self, ids: np.ndarray) -> list[tuple[_H5Dataset, np.ndarray, np.ndarray]]:
        """(dataset, positions in ``ids``, rows of that dataset) for every dataset that ``ids`` touch."""
        epochs, positions = np.divmod(ids, self._n)
        which = np.searchsorted(self._first, positions, side="right") - 1  # [b] dataset of each sample
        parts = []
        for d in np.unique(which):
            at = np.nonzero(which == d)[0]
            stream = epochs[at] * self.per_epoch[d] + positions[at] - self._first[d]  # in d's endless stream
            parts.append((self.datasets[d], at, stream % self.datasets[d].n))
        return parts

    def samples(self, indices: np.ndarray) -> Batch:
        """(input_ids [b, T], targets [b, T]) with targets -1 at padding (attention_mask 0); int64."""
        seq_len = self.targets_per_sample
        data = np.empty((len(indices), 3, seq_len), dtype=np.int64)  # [b, 3, T]
        for ds, at, rows in self._locate(indices):
            data[at] = ds.read(rows)
        targets = np.where(data[:, _MASK] == 0, -1, data[:, _LABELS])  # [b, T]
        return np.ascontiguousarray(data[:, _INPUT_IDS]), targets

    def global_tokens(self, step: int) -> int:
        """Counted targets of step ``step``'s global batch (attention_mask 1), from the mask rows only;
        at least 1, so a batch of nothing but padding trains on nothing (loss 0, zero gradients) rather
        than dividing 0 by 0. Kept for a few steps: each of the N workers asks for it."""
        with self._lock:
            if step in self._counts:
                self._counts.move_to_end(step)
                return self._counts[step]
            total = 0
            for ds, _, rows in self._locate(self.sample_indices(step)):
                total += int(np.count_nonzero(ds.read(rows, mask_only=True)))
            self._counts[step] = max(total, 1)
            if len(self._counts) > _CACHED_STEPS:
                self._counts.popitem(last=False)
            return self._counts[step]

"""Data processors: what the activation servers read and how a global batch is cut into shards.

Every processor defines the *global* batch of step ``s`` from (s, seed) alone, and a worker's shard is a
contiguous slice of it: so the samples a step trains on never depend on the number of CS-2 workers, and
1 worker and N workers see the same data. Nothing is downloaded.

A target of -1 is padding: the loss ignores it. The loss divides by the *counted* targets of the whole
global batch (``global_tokens``), which a worker cannot see from its shard alone, so the activation server
sends it with every shard.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Literal

import numpy as np

from weightstream.params.schema import FCMLPModelParams, InputParams, LanguageModelParams

__all__ = [
    "DataError",
    "DataProcessor",
    "DigitsDataProcessor",
    "SyntheticDataProcessor",
    "TextFileDataProcessor",
    "TokenFileDataProcessor",
    "make_data_processor",
]

Split = Literal["train", "eval"]
Batch = tuple[np.ndarray, np.ndarray]  # (inputs, targets); a target of -1 is ignored by the loss
ModelParams = LanguageModelParams | FCMLPModelParams


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


class _WindowedTokens(DataProcessor):
    """A token stream cut into non-overlapping windows of T+1 tokens (inputs and shifted targets)."""

    def __init__(self, tokens: np.ndarray, inp: InputParams, seed: int) -> None:
        """``tokens`` read from ``inp.data_dir``, cut into samples of ``inp.max_sequence_length``."""
        assert inp.max_sequence_length is not None
        super().__init__(inp.batch_size, seed, inp.shuffle, _drop_last(inp))
        seq_len = inp.max_sequence_length
        self.tokens, self.seq_len = tokens, seq_len
        self.targets_per_sample = seq_len
        self._n = (len(tokens) - 1) // seq_len
        if self._n < 1:
            raise DataError(
                f"{inp.data_dir!r} holds {len(tokens)} tokens, fewer than one sample of "
                f"max_sequence_length+1 = {seq_len + 1}"
            )

    @property
    def num_samples(self) -> int:
        return self._n

    def samples(self, indices: np.ndarray) -> Batch:
        starts = indices * self.seq_len  # [b]
        window = starts[:, None] + np.arange(self.seq_len + 1)  # [b, T+1]
        seq = self.tokens[window].astype(np.int64)
        return seq[:, :-1], seq[:, 1:]


def _drop_last(inp: InputParams) -> bool:
    """``drop_last`` as set, or its default: true for GptHDF5MapDataProcessor (as ModelZoo), else false."""
    if inp.drop_last is not None:
        return inp.drop_last
    return inp.data_processor == "GptHDF5MapDataProcessor"


def _files(data_dir: str | list[str], pattern: str, what: str) -> list[Path]:
    dirs = [data_dir] if isinstance(data_dir, str) else data_dir
    files: list[Path] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise DataError(f"data_dir {str(d)!r} is not a directory")
        files += sorted(d.glob(pattern))
    if not files:
        raise DataError(f"no {pattern} files in data_dir {dirs!r} ({what} reads {pattern})")
    return files


class TokenFileDataProcessor(_WindowedTokens):
    """Flat binary files of uint16 token ids (``*.bin``, as nanoGPT-style prepare scripts write them)."""

    def __init__(self, inp: InputParams, vocab_size: int, seed: int) -> None:
        assert inp.data_dir is not None
        parts = [np.memmap(f, dtype=np.uint16, mode="r") for f in _files(inp.data_dir, "*.bin", "TokenFile")]
        tokens = np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
        top = int(tokens.max())
        if top >= vocab_size:
            raise DataError(
                f"token id {top} in {inp.data_dir!r} is out of range for model.vocab_size={vocab_size}"
            )
        super().__init__(tokens, inp, seed)


class TextFileDataProcessor(_WindowedTokens):
    """UTF-8 text (``*.txt``) with byte-level tokens (vocabulary 256)."""

    def __init__(self, inp: InputParams, seed: int) -> None:
        assert inp.data_dir is not None
        data = b"".join(f.read_bytes() for f in _files(inp.data_dir, "*.txt", "TextFile"))
        tokens = np.frombuffer(data, dtype=np.uint8)
        super().__init__(tokens, inp, seed)


class SyntheticDataProcessor(DataProcessor):
    """A learnable task generated in code, endless, sample i from (seed, i).

    gpt2: arithmetic sequences x_{t+1} = x_t + stride (mod V) with a random start and a stride in 1..8;
    a model must look back one token to infer the stride, so the loss falls from ln V to near 0.
    fc_mlp: Gaussian clusters around fixed class centres.
    """

    def __init__(self, inp: InputParams, model: ModelParams, seed: int) -> None:
        super().__init__(inp.batch_size, seed, shuffle=False)
        self.model = model
        self.seq_len = inp.max_sequence_length or 0
        self.targets_per_sample = self.seq_len if isinstance(model, LanguageModelParams) else 1
        if isinstance(model, FCMLPModelParams):
            # the task itself (class centres) is fixed by the model's shape, the same for every split and seed
            centres_rng = np.random.default_rng([model.input_size, model.num_classes])
            self.centres = centres_rng.standard_normal((model.num_classes, model.input_size)).astype(
                np.float32
            )

    @property
    def num_samples(self) -> None:
        return None

    def samples(self, indices: np.ndarray) -> Batch:
        rngs = [np.random.default_rng([self.seed, int(i)]) for i in indices]
        if isinstance(self.model, LanguageModelParams):
            v = self.model.vocab_size
            seq = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
            for row, r in zip(seq, rngs, strict=True):
                start, stride = r.integers(0, v), r.integers(1, min(8, v - 1) + 1)
                row[:] = (start + stride * np.arange(self.seq_len + 1)) % v
            return seq[:, :-1], seq[:, 1:]
        labels = np.array([r.integers(0, self.model.num_classes) for r in rngs], dtype=np.int64)
        noise = np.stack([r.standard_normal(self.model.input_size, dtype=np.float32) for r in rngs])
        return self.centres[labels] + 0.7 * noise, labels


class DigitsDataProcessor(DataProcessor):
    """scikit-learn's bundled 8x8 digits (1797 images, shipped with the package): 64 features in [0, 1]
    and 10 classes. The first 1500 images are the train split, the rest the eval split."""

    TRAIN = 1500

    def __init__(self, inp: InputParams, split: Split, seed: int) -> None:
        super().__init__(inp.batch_size, seed, inp.shuffle, _drop_last(inp))
        from sklearn.datasets import load_digits  # local: only this processor needs scikit-learn

        digits = load_digits()
        x = (digits.data / 16.0).astype(np.float32)
        y = digits.target.astype(np.int64)
        sl = slice(0, self.TRAIN) if split == "train" else slice(self.TRAIN, None)
        self.x, self.y = x[sl], y[sl]

    @property
    def num_samples(self) -> int:
        return len(self.y)

    def samples(self, indices: np.ndarray) -> Batch:
        return self.x[indices], self.y[indices]


def make_data_processor(inp: InputParams, model: ModelParams, split: Split) -> DataProcessor:
    """The processor an input section asks for. Eval streams use another seed than train, so a synthetic
    eval set never repeats training samples. A DataError (files, ids, too few samples) comes from here,
    before any step runs."""
    seed = inp.shuffle_seed if split == "train" else inp.shuffle_seed + 1_000_003
    vocab_size = model.vocab_size if isinstance(model, LanguageModelParams) else 0
    processor: DataProcessor
    match inp.data_processor:
        case "TokenFileDataProcessor":
            processor = TokenFileDataProcessor(inp, vocab_size, seed)
        case "TextFileDataProcessor":
            processor = TextFileDataProcessor(inp, seed)
        case "GptHDF5MapDataProcessor":
            # local: hdf5.py builds on this module, and only this processor needs h5py
            from weightstream.data.hdf5 import GptHDF5MapDataProcessor

            processor = GptHDF5MapDataProcessor(inp, vocab_size, seed)
        case "SyntheticDataProcessor":
            processor = SyntheticDataProcessor(inp, model, seed)
        case "DigitsDataProcessor":
            processor = DigitsDataProcessor(inp, split, seed)
        case _:
            raise AssertionError(inp.data_processor)
    processor.batches_per_epoch()  # drop_last with fewer samples than a batch fails here, not mid-run
    return processor

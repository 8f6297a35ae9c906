"""Data processors: what the activation servers read and how a global batch is cut into shards.

Every processor defines the *global* batch of step ``s`` from (s, seed) alone, and a worker's shard is a
contiguous slice of it: so the samples a step trains on never depend on the number of CS-2 workers, and
1 worker and N workers see the same data. Nothing is downloaded.

A target of -1 is padding: the loss ignores it. The loss divides by the *counted* targets of the whole
global batch (``global_tokens``), which a worker cannot see from its shard alone, so the activation server
sends it with every shard.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from weightstream.data.base import Batch, DataError, DataProcessor, data_files, drop_last_of
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
ModelParams = LanguageModelParams | FCMLPModelParams


class _WindowedTokens(DataProcessor):
    """A token stream cut into non-overlapping windows of T+1 tokens (inputs and shifted targets)."""

    def __init__(self, tokens: np.ndarray, inp: InputParams, seed: int) -> None:
        """``tokens`` read from ``inp.data_dir``, cut into samples of ``inp.max_sequence_length``."""
        assert inp.max_sequence_length is not None
        super().__init__(inp.batch_size, seed, inp.shuffle, drop_last_of(inp))
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


class TokenFileDataProcessor(_WindowedTokens):
    """Flat binary files of uint16 token ids (``*.bin``, as nanoGPT-style prepare scripts write them)."""

    def __init__(self, inp: InputParams, vocab_size: int, seed: int) -> None:
        assert inp.data_dir is not None
        files = data_files(inp.data_dir, "*.bin", "TokenFile")
        parts = [np.memmap(f, dtype=np.uint16, mode="r") for f in files]
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
        data = b"".join(f.read_bytes() for f in data_files(inp.data_dir, "*.txt", "TextFile"))
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
        super().__init__(inp.batch_size, seed, inp.shuffle, drop_last_of(inp))
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
            # local: only this processor needs h5py
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

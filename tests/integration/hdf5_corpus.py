"""HDF5 files in ModelZoo's layout (GptHDF5MapDataProcessor's input) made from text: each line a byte-level
document ended by EOS, cut into windows of SEQ + 1 tokens, the last padded as ModelZoo's preprocessing
pads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", reason="GptHDF5MapDataProcessor reads HDF5 with h5py")

SEQ = 32  # max_sequence_length
EOS = 0  # byte 0 does not occur in text, so it can end a document


def byte_documents(text: str) -> list[np.ndarray]:
    """Lines of ``text`` (10 bytes or more) as UTF-8 byte ids (vocabulary 256), each ended by EOS. Lines
    are short documents: a good part of the tokens end up as padding."""
    assert chr(EOS) not in text
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 10]
    return [np.frombuffer(line.encode() + bytes([EOS]), dtype=np.uint8).astype(np.int32) for line in lines]


def samples(doc: np.ndarray) -> np.ndarray:
    """[k, 3, SEQ] samples of one document: windows of SEQ + 1 tokens (input_ids, next-token labels);
    the last window is padded (ids 0, attention_mask 0, labels 0), as ModelZoo's preprocessing does."""
    out = []
    for start in range(0, len(doc) - 1, SEQ):
        w = doc[start : start + SEQ + 1]
        s = np.zeros((3, SEQ), np.int32)
        n = len(w) - 1
        s[0, :n], s[1, :n], s[2, :n] = w[:-1], 1, w[1:]
        out.append(s)
    return np.stack(out)


def write_corpus(where: Path, docs: list[np.ndarray], files: int) -> int:
    """Documents round-robin into ``files`` .h5 files; returns the number of samples."""
    where.mkdir(parents=True)
    total = 0
    for f in range(files):
        data = np.concatenate([samples(d) for d in docs[f::files]])
        with h5py.File(where / f"part-{f:02d}.h5", "w") as h:
            h.create_dataset("data", data=data)
            h.attrs["n_examples"] = len(data)
        total += len(data)
    return total

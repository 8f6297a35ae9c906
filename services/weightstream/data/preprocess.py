"""``weightstream data-preprocess``: a text corpus into GPT training samples in ModelZoo's HDF5 layout.

What we match of ModelZoo (``cszoo data_preprocess`` in pretraining mode, and the older
``create_hdf5_dataset.py LMData``: ``hdf5_base_preprocessor.py``, ``utils.py``, ``data_preprocessor.py``
of Cerebras/modelzoo), so that ``GptHDF5MapDataProcessor``-style readers take our files:

- each ``.h5`` holds one dataset ``data`` of shape ``[n, 3, max_sequence_length]``, dtype ``i4``, rows
  (input_ids, attention_mask, labels), chunked one sample per chunk, gzip-compressed; the file attribute
  ``n_examples`` is n;
- documents are tokenized without special tokens, the end-of-document id appended after each, and the
  stream packed across documents into windows of ``max_sequence_length + 1`` tokens at a stride of
  ``max_sequence_length`` (``create_features_auto_lm``: input_ids = window[:-1], labels = window[1:],
  so a sample's last label is the next sample's first input); the remainder is written padded
  (``write_remainder``: pad id in input_ids and labels, mask 0 there) unless it is shorter than 2 tokens;
- ``data_params.json`` beside the files, with ModelZoo's ``setup``/``processing``/``dataset`` sections,
  ``post-process`` counts and ``h5_dataset_stats``.

Ours on top: the attributes ``vocab_size``, ``max_sequence_length``, ``eos_id``, ``pad_id`` in every file,
files named ``data-00000.h5`` ... (the names ModelZoo's HDF5 shuffler writes), a ``weightstream`` section in
``data_params.json`` (counts and the command's options), and an atomic result: everything is written into a
hidden temporary directory beside the output, fsynced, and renamed into place only at the end.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from weightstream.data._output import ShardWriter, check_output, new_temp_dir, publish, write_params
from weightstream.data.documents import DataPreprocessError, Document, find_input_files, read_documents
from weightstream.data.tokenizer import LoadedTokenizer, load_tokenizer

__all__ = [
    "DEFAULT_SAMPLES_PER_FILE",
    "DataPreprocessError",
    "Packer",
    "PreprocessProgress",
    "PreprocessSummary",
    "pack",
    "preprocess",
]

DEFAULT_SAMPLES_PER_FILE = 50_000  # ModelZoo's files_per_record
BATCH_CHARS = 1 << 20  # text per tokenizing task: IPC is noise next to it, and memory stays a few MiB a task


@dataclass(frozen=True)
class PreprocessProgress:
    files_done: int
    files_total: int
    documents: int
    tokens: int


@dataclass(frozen=True)
class PreprocessSummary:
    output_dir: Path
    files: list[str]  # the .h5 files written, in order
    input_files: int
    ignored_files: int  # files in the input directory of other kinds
    documents: int
    tokens: int  # every token of the stream, the end-of-document ones included
    samples: int
    max_sequence_length: int
    vocab_size: int
    eos_id: int
    pad_id: int
    seconds: float


class Packer:
    """Cuts a token stream into samples of max_sequence_length+1 tokens at a stride of max_sequence_length
    (ModelZoo's packing), however the stream arrives in pieces."""

    def __init__(self, max_sequence_length: int, pad_id: int) -> None:
        self.msl, self.pad_id = max_sequence_length, pad_id
        self.carry = np.empty(0, dtype=np.int32)  # tokens not yet the *input* of any sample: 0..msl of them

    def push(self, stream: np.ndarray) -> np.ndarray:
        """The full samples the stream completes: ``[n, 3, msl]`` int32 (input_ids, mask, labels)."""
        T = self.msl
        buf = np.concatenate([self.carry, stream.astype(np.int32, copy=False)])  # [L]
        n = max(0, (len(buf) - 1) // T)  # sample k is buf[k*T : k*T + T + 1]
        out = np.empty((n, 3, T), dtype=np.int32)
        if n == 0:
            self.carry = buf
            return out
        windows = np.lib.stride_tricks.sliding_window_view(buf, T + 1)[: n * T : T]  # [n, T+1], a view
        out[:, 0] = windows[:, :-1]
        out[:, 1] = 1
        out[:, 2] = windows[:, 1:]
        self.carry = buf[n * T :]  # its first token is the last label written: the next sample's first input
        return out

    def finish(self) -> np.ndarray:
        """The remainder as one padded sample ``[1, 3, msl]``, or ``[0, 3, msl]`` if under 2 tokens."""
        rest, T = self.carry, self.msl  # [r], r <= T
        self.carry = np.empty(0, dtype=np.int32)
        if len(rest) < 2:  # one token has no label (and it was already the last label written)
            return np.empty((0, 3, T), dtype=np.int32)
        r = len(rest) - 1
        out = np.full((1, 3, T), self.pad_id, dtype=np.int32)
        out[0, 0, :r] = rest[:-1]
        out[0, 1] = 0
        out[0, 1, :r] = 1
        out[0, 2, :r] = rest[1:]
        return out


def pack(stream: np.ndarray, max_sequence_length: int, pad_id: int) -> np.ndarray:
    """A whole token stream as samples ``[n, 3, max_sequence_length]``, the remainder padded."""
    packer = Packer(max_sequence_length, pad_id)
    return np.concatenate([packer.push(stream), packer.finish()])


# --------------------------------------------------------------------------------------------------------
# Tokenizing: here, or in a pool of processes whose results are taken in submission order
# --------------------------------------------------------------------------------------------------------
def _encode(tokenizer: Tokenizer, eos_id: int, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Documents -> (their token stream with the end-of-document id after each, [tokens] int32;
    each document's token count with it, [documents] int64)."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # _fast: no offsets computed
    ids = [e.ids for e in encode(texts, add_special_tokens=False)]  # no BOS/CLS templates: we add the EOS
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))  # [documents]
    ends = np.cumsum(lengths)  # one past each document's EOS
    stream = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int32)  # [tokens]
    stream[ends - 1] = eos_id
    for x, end in zip(ids, ends, strict=True):
        stream[end - len(x) - 1 : end - 1] = x
    return stream, lengths


def _for_documents(tokenizer_json: str) -> Tokenizer:
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.encode_special_tokens = True  # "<|endoftext|>" written in a document is text, not a boundary
    return tokenizer


_worker: tuple[Tokenizer, int] | None = None  # a pool process's tokenizer and end-of-document id


def _init_worker(tokenizer_json: str, eos_id: int) -> None:
    global _worker
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process: the pool is the parallelism
    _worker = (_for_documents(tokenizer_json), eos_id)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _worker is not None
    return _encode(*_worker, texts)


def _batches(documents: Iterator[Document]) -> Iterator[list[Document]]:
    batch: list[Document] = []
    size = 0
    for doc in documents:
        batch.append(doc)
        size += len(doc.text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


Encoded = tuple[list[Document], np.ndarray, np.ndarray]  # (batch, stream, lengths)


def _encoded(
    batches: Iterator[list[Document]], tokenizer_json: str, eos_id: int, processes: int
) -> Generator[Encoded, None, None]:
    """Each batch with its encoding, in input order whatever the number of processes (so the output never
    depends on it); at most two tasks per process in flight, so the corpus is never read ahead into memory."""
    if processes == 1:
        tokenizer = _for_documents(tokenizer_json)
        for batch in batches:
            yield batch, *_encode(tokenizer, eos_id, [d.text for d in batch])
        return
    # spawn, not fork: the caller may run threads (a progress bar, the tokenizer library's), and a lock
    # forked while held hangs the child. An executor, not a multiprocessing.Pool: a process that dies
    # (killed, out of memory, an unguarded __main__) fails the run instead of hanging it.
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(processes, context, _init_worker, (tokenizer_json, eos_id))
    pending: deque[tuple[list[Document], Future[tuple[np.ndarray, np.ndarray]]]] = deque()
    try:
        for batch in batches:
            pending.append((batch, pool.submit(_encode_in_worker, [d.text for d in batch])))
            if len(pending) >= 2 * processes:
                done, result = pending.popleft()
                yield done, *result.result()
        while pending:
            done, result = pending.popleft()
            yield done, *result.result()
    except BrokenProcessPool as e:
        raise RuntimeError(
            "a tokenizer process died; when calling preprocess() from a script, put the call under "
            "`if __name__ == '__main__':` (processes are spawned), or pass num_processes=1"
        ) from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_ids(stream: np.ndarray, lengths: np.ndarray, batch: list[Document], vocab_size: int) -> None:
    bad = np.flatnonzero((stream < 0) | (stream >= vocab_size))
    if len(bad):
        doc = batch[int(np.searchsorted(np.cumsum(lengths), bad[0], side="right"))]
        raise DataPreprocessError(
            f"token id {int(stream[bad[0]])} is out of range for the tokenizer's vocab size {vocab_size}",
            doc.path,
            doc.line,
        )


@dataclass
class _Counts:
    documents: int = 0
    tokens: int = 0
    chars: int = 0
    bytes: int = 0
    samples: int = 0
    non_pad: int = 0  # input ids neither end-of-document nor padding (ModelZoo's non_pad_tokens)
    loss_valid: int = 0  # attention_mask ones (ModelZoo's loss_valid_tokens)


def _tokenize_and_write(
    files: list[Path],
    tok: LoadedTokenizer,
    writer: ShardWriter,
    jsonl_key: str,
    processes: int,
    progress: Callable[[PreprocessProgress], None] | None,
) -> _Counts:
    counts = _Counts()
    packer = Packer(writer.msl, tok.pad_id)

    def write(samples: np.ndarray) -> None:  # [n, 3, msl]
        writer.append(samples)
        ids = samples[:, 0]  # [n, msl]
        counts.samples += len(samples)
        counts.non_pad += int(np.count_nonzero((ids != tok.eos_id) & (ids != tok.pad_id)))
        counts.loss_valid += int(samples[:, 1].sum())

    index = {path: i for i, path in enumerate(files)}
    batches = _batches(read_documents(files, jsonl_key))
    # closing(): on an error here the pool stops now, not when the traceback is collected
    with closing(_encoded(batches, tok.tokenizer.to_str(), tok.eos_id, processes)) as encoded:
        for batch, stream, lengths in encoded:
            _check_ids(stream, lengths, batch, tok.vocab_size)
            write(packer.push(stream))
            counts.documents += len(batch)
            counts.tokens += len(stream)
            counts.chars += sum(len(d.text) for d in batch)
            counts.bytes += sum(len(d.text.encode("utf-8")) for d in batch)
            if progress is not None:  # every file before the one of the batch's last document is done
                done = index[batch[-1].path]
                progress(PreprocessProgress(done, len(files), counts.documents, counts.tokens))
    write(packer.finish())
    if progress is not None:
        progress(PreprocessProgress(len(files), len(files), counts.documents, counts.tokens))
    return counts


def _available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on, not the machine's
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def preprocess(
    input_dir: Path,
    tokenizer_path: Path,
    max_sequence_length: int,
    output_dir: Path,
    jsonl_key: str = "text",
    num_processes: int | None = None,
    samples_per_file: int = DEFAULT_SAMPLES_PER_FILE,
    overwrite: bool = False,
    progress: Callable[[PreprocessProgress], None] | None = None,
    eos_token: str | None = None,
) -> PreprocessSummary:
    """Tokenize every document under ``input_dir`` with ``tokenizer_path``, pack the stream into samples of
    ``max_sequence_length`` tokens and write them as ``output_dir/data-00000.h5`` ... with
    ``data_params.json``. ``num_processes`` tokenizer processes (default: the cores this process may use;
    1 tokenizes here); the output is the same for every value. Raises :class:`DataPreprocessError`, and
    leaves ``output_dir`` as it was, for bad options, an unusable corpus or tokenizer."""
    start = time.perf_counter()
    if max_sequence_length < 2:
        raise DataPreprocessError(f"max_sequence_length {max_sequence_length}: expected at least 2")
    if samples_per_file < 1:
        raise DataPreprocessError(f"samples_per_file {samples_per_file}: expected at least 1")
    processes = _available_cores() if num_processes is None else num_processes
    if processes < 1:
        raise DataPreprocessError(f"num_processes {processes}: expected at least 1")
    check_output(output_dir, overwrite)
    files, ignored = find_input_files(input_dir)
    tok = load_tokenizer(tokenizer_path, eos_token=eos_token)
    options = {
        "input": str(input_dir.resolve()),
        "tokenizer": str(tok.path.resolve()),
        "max_sequence_length": max_sequence_length,
        "output": str(output_dir.resolve()),
        "jsonl_key": jsonl_key,
        "num_processes": processes,
        "samples_per_file": samples_per_file,
        "overwrite": overwrite,
        "input_files": len(files),
    }
    attrs = {"vocab_size": tok.vocab_size, "max_sequence_length": max_sequence_length}
    attrs |= {"eos_id": tok.eos_id, "pad_id": tok.pad_id}
    # a run killed before the final rename leaves only this hidden directory, never one that looks like a
    # finished dataset
    tmp = new_temp_dir(output_dir)
    writer = ShardWriter(tmp, max_sequence_length, samples_per_file, attrs)
    try:
        counts = _tokenize_and_write(files, tok, writer, jsonl_key, processes, progress)
        if counts.documents == 0:
            raise DataPreprocessError(f"no documents: its {len(files)} corpus files hold no text", input_dir)
        names = writer.close()
        ids = {"eos_id": tok.eos_id, "pad_id": tok.pad_id, "vocab_size": tok.vocab_size}
        tokens = {"eos_token": tok.eos_token, "pad_token": tok.pad_token}
        write_params(tmp, options, ids, tokens, dataclasses.asdict(counts), names)
        publish(tmp, output_dir, overwrite)
    except BaseException:
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreprocessSummary(
        output_dir=output_dir,
        files=names,
        input_files=len(files),
        ignored_files=ignored,
        documents=counts.documents,
        tokens=counts.tokens,
        samples=counts.samples,
        max_sequence_length=max_sequence_length,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        seconds=time.perf_counter() - start,
    )

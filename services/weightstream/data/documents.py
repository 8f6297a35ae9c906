"""Raw text corpora as a stream of documents: what ``tokenizer-train`` and ``data-preprocess`` read.

A corpus is a directory (searched recursively) of ``.txt`` files, one document per file, and ``.jsonl`` /
``.jsonl.gz`` files, one JSON object per line with the text under a key (``text`` by default), as
ModelZoo's ``LMData`` preprocessing reads them. Files are read in sorted order of their relative paths,
so the same directory always gives the same stream. Every problem is a :class:`DataPreprocessError` that
names the file and the line (and the byte offset for text that is not UTF-8).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from weightstream.data.base import DataError

__all__ = ["SUPPORTED_SUFFIXES", "DataPreprocessError", "Document", "find_input_files", "read_documents"]

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz")


class DataPreprocessError(DataError):
    """A corpus or tokenizer that cannot be preprocessed; the message names the file and line. Permanent."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None) -> None:
        self.path, self.line = path, line
        where = "" if path is None else f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class Document:
    text: str
    path: Path
    line: int  # 1-based line of a .jsonl record; 1 for a .txt file (the whole file)


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in SUPPORTED_SUFFIXES if name.endswith(s)), None)


def find_input_files(input_dir: Path) -> tuple[list[Path], int]:
    """The supported files under ``input_dir`` in sorted order, and how many other files were ignored."""
    if not input_dir.is_dir():
        raise DataPreprocessError("not a directory", input_dir)
    files, ignored = [], 0
    for path in sorted(input_dir.rglob("*"), key=lambda p: p.relative_to(input_dir).as_posix()):
        if not path.is_file():
            continue
        if _suffix(path) is None:
            ignored += 1
        else:
            files.append(path)
    if not files:
        kinds = ", ".join(SUPPORTED_SUFFIXES)
        if ignored == 0:
            raise DataPreprocessError(
                f"no corpus files: the directory is empty (expected {kinds})", input_dir
            )
        raise DataPreprocessError(f"no corpus files: none of its {ignored} files is {kinds}", input_dir)
    return files, ignored


def _decode(data: bytes, path: Path, line: int, file_offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = line + data.count(b"\n", 0, e.start)  # the line of the bad byte, not of the record's start
        raise DataPreprocessError(
            f"not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset {file_offset + e.start} "
            f"({e.reason}); is this a binary file?",
            path,
            bad,
        ) from None


def _read_txt(path: Path) -> Iterator[Document]:
    text = _decode(path.read_bytes(), path, 1, 0)  # one document: it must be whole to be tokenized anyway
    if text:
        yield Document(text, path, 1)


def _read_jsonl(path: Path, jsonl_key: str) -> Iterator[Document]:
    # bytes, line by line: one record in memory at a time, offsets counted in the (decompressed) stream
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    offset = 0
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                line = _decode(raw, path, number, offset)
                offset += len(raw)
                if not line.strip():
                    continue  # a blank line (often the last one) is no record
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataPreprocessError(
                        f"not JSON ({e.msg} at column {e.colno})", path, number
                    ) from None
                if not isinstance(record, dict):
                    raise DataPreprocessError(
                        f"a JSON {type(record).__name__}, expected an object with key {jsonl_key!r}",
                        path,
                        number,
                    )
                if jsonl_key not in record:
                    keys = ", ".join(map(repr, list(record)[:8])) or "none"
                    raise DataPreprocessError(
                        f"no key {jsonl_key!r} (keys: {keys}); choose the key with --jsonl_key", path, number
                    )
                text = record[jsonl_key]
                if not isinstance(text, str):
                    raise DataPreprocessError(
                        f"{jsonl_key!r} is a JSON {type(text).__name__}, expected a string", path, number
                    )
                if text:
                    yield Document(text, path, number)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz, or an unreadable file
        raise DataPreprocessError(f"cannot read: {e}", path) from e


def read_documents(files: list[Path], jsonl_key: str = "text") -> Iterator[Document]:
    """Every non-empty document of ``files``, in order; empty ones carry no text and are skipped."""
    for path in files:
        if _suffix(path) == ".txt":
            try:
                yield from _read_txt(path)
            except OSError as e:
                raise DataPreprocessError(f"cannot read: {e}", path) from e
        else:
            yield from _read_jsonl(path, jsonl_key)

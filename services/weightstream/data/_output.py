"""The output of ``data-preprocess``: samples into ModelZoo-layout HDF5 files as they come, in a
temporary directory that is renamed into place only when complete.

The layout is ModelZoo's (``write_hdf5_file`` / ``save_buffer_to_hdf5`` in Cerebras/modelzoo): one dataset
``data`` ``[n, 3, max_sequence_length]`` of ``i4``, chunks of one sample ``(1, 3, msl)`` (a reader that
picks samples at random decompresses only what it reads), gzip, and the file attribute ``n_examples``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from weightstream import __version__
from weightstream.data.documents import DataPreprocessError
from weightstream.storage_io import fsync_dir  # a file's contents or a directory's entries to the disk

__all__ = [
    "DATA",
    "PARAMS_FILE",
    "ShardWriter",
    "check_output",
    "new_temp_dir",
    "publish",
    "write_params",
]

DATA = "data"  # ModelZoo's dataset name
PARAMS_FILE = "data_params.json"  # ModelZoo's name


def new_temp_dir(output_dir: Path) -> Path:
    """A new hidden directory beside ``output_dir`` (the same filesystem, so renaming it there is atomic),
    with the permissions the umask gives (``mkdtemp``'s 0700 would become the dataset's)."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = output_dir.parent / f".{output_dir.name}.tmp-{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


class ShardWriter:
    """Writes ``data-00000.h5``, ``data-00001.h5``, ... in ``directory``, ``per_file`` samples each (the
    last one fewer), appending each block of samples as it arrives: no file is ever held in memory."""

    def __init__(self, directory: Path, max_sequence_length: int, per_file: int, attrs: dict[str, Any]):
        self.directory, self.msl, self.per_file, self.attrs = directory, max_sequence_length, per_file, attrs
        self.names: list[str] = []
        self._file: h5py.File | None = None
        self._count = 0  # samples in the open file

    def _open(self) -> h5py.Dataset:
        name = f"data-{len(self.names):05d}.h5"
        self._file = h5py.File(self.directory / name, "w")
        self.names.append(name)
        self._count = 0
        return self._file.create_dataset(
            DATA,
            shape=(0, 3, self.msl),
            maxshape=(self.per_file, 3, self.msl),
            dtype="i4",
            chunks=(1, 3, self.msl),
            compression="gzip",
        )

    def append(self, samples: np.ndarray) -> None:
        """Append ``samples`` ``[n, 3, msl]`` int32, starting new files as they fill."""
        assert samples.ndim == 3 and samples.shape[1:] == (3, self.msl), samples.shape
        while len(samples):
            data = self._open() if self._file is None else self._file[DATA]
            take = samples[: self.per_file - self._count]  # [k, 3, msl]
            data.resize(self._count + len(take), axis=0)
            data[self._count :] = take
            self._count += len(take)
            samples = samples[len(take) :]
            if self._count == self.per_file:
                self._close()

    def _close(self) -> None:
        assert self._file is not None
        self._file.attrs["n_examples"] = self._count  # ModelZoo's attribute
        for key, value in self.attrs.items():
            self._file.attrs[key] = value
        self._file.close()
        self._file = None
        fsync_dir(self.directory / self.names[-1])

    def close(self) -> list[str]:
        """Finish the open file; the names of every file written, in order."""
        if self._file is not None:
            self._close()
        return self.names

    def abort(self) -> None:
        """Close the open file without finishing it (its directory is about to be deleted)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _is_old_output(directory: Path) -> bool:
    return all(p.is_file() and (p.suffix == ".h5" or p.name == PARAMS_FILE) for p in directory.iterdir())


def check_output(output_dir: Path, overwrite: bool) -> None:
    """Refuse an output path that is a file, a non-empty directory without ``overwrite``, or (with it)
    a directory holding anything but an earlier output: ``overwrite`` never deletes a user's files."""
    if output_dir.exists() and not output_dir.is_dir():
        raise DataPreprocessError("exists and is not a directory", output_dir)
    if not output_dir.is_dir() or not any(output_dir.iterdir()):
        return
    if not overwrite:
        raise DataPreprocessError(
            "the output directory is not empty; pass --overwrite to replace it", output_dir
        )
    if not _is_old_output(output_dir):  # --overwrite deletes it: never a directory of anything else
        raise DataPreprocessError(
            f"the output directory holds files other than .h5 and {PARAMS_FILE}: not replacing it, "
            "even with --overwrite",
            output_dir,
        )


def publish(tmp: Path, output_dir: Path, overwrite: bool) -> None:
    """Rename the finished temporary directory to ``output_dir``, replacing an old output if allowed."""
    check_output(output_dir, overwrite)  # again: another run may have written there meanwhile
    if output_dir.is_dir() and any(output_dir.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=output_dir.parent))
        os.replace(output_dir, old)  # onto the empty directory just made
        os.replace(tmp, output_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp, output_dir)  # POSIX renames a directory onto an empty one
    fsync_dir(output_dir.parent)


def write_params(
    directory: Path,
    options: dict[str, Any],
    ids: dict[str, int],
    tokens: dict[str, str],
    counts: dict[str, int],
    names: list[str],
) -> None:
    """data_params.json: ModelZoo's sections and statistics (its ``dump_args`` and ``dump_result``), then
    a ``weightstream`` section with the command's options and counts; fsynced, with the directory."""
    msl = options["max_sequence_length"]
    params = {
        "setup": {
            "mode": "pretraining",
            "input_dir": options["input"],
            "output_dir": options["output"],
            "processes": options["num_processes"],
        },
        "processing": {
            "huggingface_tokenizer": options["tokenizer"],
            "max_seq_length": msl,
            "files_per_record": options["samples_per_file"],
            "write_remainder": True,
            **ids,
        },
        "dataset": {"jsonl_key": options["jsonl_key"], "pack_sequences": True},
        "post-process": {
            "processed_files": options["input_files"],
            "successful_files": options["input_files"],
            "discarded_files": 0,
            "n_examples": counts["samples"],
            "raw_chars_count": counts["chars"],
            "raw_bytes_count": counts["bytes"],
            **ids,
        },
        "h5_dataset_stats": {
            "num_sequences": counts["samples"],
            "num_tokens": counts["samples"] * msl,
            "non_pad_tokens": counts["non_pad"],
            "loss_valid_tokens": counts["loss_valid"],
        },
        "weightstream": {
            "version": __version__,
            "command": "weightstream data-preprocess",
            "options": {k: v for k, v in options.items() if k != "input_files"},
            **tokens,
            **{k: counts[k] for k in ("documents", "tokens", "samples")},
            "input_files": options["input_files"],
            "files": names,
        },
    }
    with open(directory / PARAMS_FILE, "w", encoding="utf-8") as f:
        f.write(json.dumps(params, indent=4, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)

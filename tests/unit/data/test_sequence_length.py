"""max_sequence_length left out of an HDF5 input is read from the files, as ModelZoo's trainer: configs
expect; a length the model cannot hold, or files that cannot say, are errors naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from tests.params_files import LEGACY
from weightstream.data.check import with_sequence_lengths
from weightstream.params import ParamsError, load_params


def _h5(where: Path, seq: int) -> Path:
    where.mkdir(parents=True)
    with h5py.File(where / "data-0.h5", "w") as f:
        f.create_dataset("data", data=np.ones((4, 3, seq), np.int32))
    return where


def _params(data: Path, **inputs: Any) -> dict[str, Any]:
    raw = copy.deepcopy(LEGACY)
    for sec in ("train_input", "eval_input"):
        raw[sec] = {"data_processor": "GptHDF5MapDataProcessor", "data_dir": str(data), "batch_size": 16}
        raw[sec] |= inputs
    return raw


def test_left_out_length_is_read_from_the_files(tmp_path: Path) -> None:
    p = load_params(_params(_h5(tmp_path / "d", 24)))
    assert p.train_input.max_sequence_length is None  # validation opens no file
    filled = with_sequence_lengths(p)
    assert filled.eval_input is not None
    assert filled.train_input.max_sequence_length == 24 and filled.eval_input.max_sequence_length == 24
    given = load_params(_params(tmp_path / "d", max_sequence_length=24))
    assert with_sequence_lengths(given) is given  # a given length is left as it is


def test_too_long_or_unreadable_is_an_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match=r"train_input.max_sequence_length: is 128 in the files"):
        with_sequence_lengths(load_params(_params(_h5(tmp_path / "long", 128))))
    # the directory is what is wrong, and what the user wrote: it is named, not the length left out
    with pytest.raises(
        ParamsError,
        match=r"train_input.data_dir: data_dir '.*missing' is not a directory; "
        r"GptHDF5MapDataProcessor reads \*.h5 files there",
    ):
        with_sequence_lengths(load_params(_params(tmp_path / "missing")))
    (tmp_path / "bad").mkdir()
    with h5py.File(tmp_path / "bad" / "a.h5", "w") as f:
        f.create_dataset("data", data=np.ones((4, 24), np.int32))
    with pytest.raises(ParamsError, match=r"must be \[n, 3, max_sequence_length\]"):
        with_sequence_lengths(load_params(_params(tmp_path / "bad")))

"""``max_sequence_length`` read from the HDF5 files when a params file leaves it out.

None of ModelZoo's ``trainer:`` configs give it: the files say it (``data`` is ``[n, 3, T]``). The
coordinator fills it in once, before anything is scheduled (``weightstream run``/``validate`` after
loading; the service after confining the paths to its data roots, so no path outside them is opened),
and the resolved params every role loads carry the value. ``data/check.py`` applies it to a job's params
(``resolve_sequence_lengths``, ``with_sequence_lengths``) and reports where the files cannot say it.
"""

from __future__ import annotations

import h5py

from weightstream.data.base import DataError, data_files
from weightstream.params.schema import InputParams

__all__ = ["sequence_length"]

_HDF5 = "GptHDF5MapDataProcessor"


def sequence_length(inp: InputParams) -> int:
    """T of the first ``.h5`` file of ``inp``'s first dataset (the reader checks every file against it)."""
    data_dir = inp.mixture[0].data_dir if inp.mixture else inp.data_dir
    assert data_dir is not None  # params/checks.py: data_dir or mixture
    first = data_files(data_dir, "*.h5", _HDF5)[0]
    try:
        with h5py.File(first, "r") as f:
            shape: tuple[int, ...] = f["data"].shape if "data" in f else ()
    except OSError as e:
        raise DataError(f"{first}: not a readable HDF5 file ({e})") from e
    if len(shape) != 3 or shape[1] != 3:
        raise DataError(f"{first}: dataset 'data' must be [n, 3, max_sequence_length], not {list(shape)}")
    return int(shape[2])

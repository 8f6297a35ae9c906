"""``max_sequence_length`` read from the HDF5 files when a params file leaves it out.

None of ModelZoo's ``trainer:`` configs give it: the files say it (``data`` is ``[n, 3, T]``). The
coordinator fills it in once, before anything is scheduled (``weightstream run``/``validate`` after
loading; the service after confining the paths to its data roots, so no path outside them is opened),
and the resolved params every role loads carry the value.
"""

from __future__ import annotations

import h5py

from weightstream.data.processors import DataError, _files
from weightstream.params import Params, ParamsError, Problem
from weightstream.params.schema import InputParams, LanguageModelParams

__all__ = ["sequence_length", "with_sequence_lengths"]

_HDF5 = "GptHDF5MapDataProcessor"


def sequence_length(inp: InputParams) -> int:
    """T of the first ``.h5`` file of ``inp``'s first dataset (the reader checks every file against it)."""
    data_dir = inp.mixture[0].data_dir if inp.mixture else inp.data_dir
    assert data_dir is not None  # params/checks.py: data_dir or mixture
    first = _files(data_dir, "*.h5", _HDF5)[0]
    try:
        with h5py.File(first, "r") as f:
            shape = f["data"].shape if "data" in f else ()
    except OSError as e:
        raise DataError(f"{first}: not a readable HDF5 file ({e})") from e
    if len(shape) != 3 or shape[1] != 3:
        raise DataError(f"{first}: dataset 'data' must be [n, 3, max_sequence_length], not {list(shape)}")
    return int(shape[2])


def with_sequence_lengths(p: Params) -> Params:
    """``p`` with every HDF5 input's ``max_sequence_length`` set from its files where it was left out.
    ParamsError naming the input when the files cannot say, or say more than the model has positions."""
    if not isinstance(p.model, LanguageModelParams):
        return p
    updates, problems = {}, []
    for sec in ("train_input", "eval_input"):
        inp = getattr(p, sec)
        if inp is None or inp.data_processor != _HDF5 or inp.max_sequence_length is not None:
            continue
        try:
            t = sequence_length(inp)
        except DataError as e:
            problems.append(Problem(f"{sec}.max_sequence_length", f"is left out and cannot be read: {e}"))
            continue
        if t > p.model.max_position_embeddings:
            problems.append(
                Problem(
                    f"{sec}.max_sequence_length",
                    f"is {t} in the files of data_dir, more than model.max_position_embeddings="
                    f"{p.model.max_position_embeddings}",
                )
            )
        updates[sec] = inp.model_copy(update={"max_sequence_length": t})
    if problems:
        raise ParamsError(problems, "params")
    return p.model_copy(update=updates) if updates else p

"""The data a job's inputs name, checked before any role starts: the files are there, hold at least a
batch, and (GptHDF5MapDataProcessor) say the sequence length the params leave out. Every failure is a
``Problem`` at the key a user changes (``train_input.data_dir`` with the path, ``batch_size``, ...), so
``weightstream validate``, ``weightstream run`` and the service report them with the params' own."""

from __future__ import annotations

from weightstream.data.processors import DataError, make_data_processor
from weightstream.data.sequence_length import sequence_length
from weightstream.params import Params, ParamsError, Problem
from weightstream.params.schema import InputParams, LanguageModelParams

__all__ = ["FILE_PROCESSORS", "data_problems", "resolve_sequence_lengths", "with_sequence_lengths"]

_HDF5 = "GptHDF5MapDataProcessor"
# the processors that read files from a data_dir (the others generate their data)
FILE_PROCESSORS = frozenset({"TextFileDataProcessor", "TokenFileDataProcessor", _HDF5})
SECTIONS = ("train_input", "eval_input")


def _problem(sec: str, inp: InputParams, e: DataError, why: str = "") -> Problem:
    """``e`` at the key it names: the data directory (a mixture's, or data_dir) with the path written."""
    if "." in e.key:  # a key of another section (model.vocab_size)
        return Problem(e.key, f"{e}{why}")
    if e.key == "data_dir" and inp.mixture is not None:
        return Problem(f"{sec}.mixture", f"{e}{why}", [m.data_dir for m in inp.mixture])
    return Problem(f"{sec}.{e.key}", f"{e}{why}", getattr(inp, e.key))


def resolve_sequence_lengths(p: Params) -> tuple[Params, list[Problem]]:
    """``p`` with every HDF5 input's left-out ``max_sequence_length`` read from its files, and the
    problems: a data directory that cannot say it is reported at the directory (the key the user wrote),
    a length beyond the model's positions at ``max_sequence_length``."""
    if not isinstance(p.model, LanguageModelParams):
        return p, []
    updates, problems = {}, []
    for sec in SECTIONS:
        inp = getattr(p, sec)
        if inp is None or inp.data_processor != _HDF5 or inp.max_sequence_length is not None:
            continue
        try:
            t = sequence_length(inp)
        except DataError as e:
            why = f"; {_HDF5} reads *.h5 files there, and max_sequence_length (left out) from them"
            problems.append(_problem(sec, inp, e, why))
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
    return (p.model_copy(update=updates) if updates else p), problems


def with_sequence_lengths(p: Params) -> Params:
    """``p`` with every HDF5 input's ``max_sequence_length`` set from its files where it was left out.
    ParamsError at the input's data directory when the files cannot say, or at ``max_sequence_length``
    when they say more than the model has positions."""
    p, problems = resolve_sequence_lengths(p)
    if problems:
        raise ParamsError(problems, "params")
    return p


def _readable(inp: InputParams, p: Params) -> bool:
    """Whether the keys a processor needs are there: a directory for the file readers, a sequence length
    for a language model's."""
    if inp.data_processor in FILE_PROCESSORS and not inp.data_dir and inp.mixture is None:
        return False
    return not (isinstance(p.model, LanguageModelParams) and inp.max_sequence_length is None)


def data_problems(
    p: Params, processors: frozenset[str] | None = None, skip: frozenset[str] = frozenset()
) -> list[Problem]:
    """Open each input's data as the activation servers will (``processors``: only inputs read by
    these; never the sections in ``skip``). An HDF5 input must have its ``max_sequence_length``
    (``resolve_sequence_lengths``)."""
    problems = []
    for sec in SECTIONS:
        inp = getattr(p, sec)
        if inp is None or sec in skip:
            continue
        if processors is not None and inp.data_processor not in processors:
            continue
        if not _readable(inp, p):  # params/checks.py names what is missing
            continue
        try:
            make_data_processor(inp, p.model, "train" if sec == "train_input" else "eval")
        except DataError as e:
            problems.append(_problem(sec, inp, e))
    return problems

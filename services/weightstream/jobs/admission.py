"""What a submitted job's params must pass before the job is queued, beyond being valid params."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from weightstream.data.check import with_sequence_lengths
from weightstream.jobs.data_roots import check_data, confine_data
from weightstream.jobs.limits import ServiceLimits, check_params
from weightstream.params import Params, ParamsError

__all__ = ["admit"]


def admit(p: Params, limits: ServiceLimits, roots: Sequence[Path]) -> Params:
    """``p`` within the service's size limits and data roots, its data readable, an HDF5 input's
    left-out sequence length read from its files. Sizes are checked from counts before any file is
    opened, and again once the files have said how long a sample is. Raises ParamsError."""
    problems = check_params(p, limits)  # sizes from counts: nothing is built before this passes
    if problems:
        raise ParamsError(problems, "params")
    p = with_sequence_lengths(confine_data(p, roots))  # only confined paths are opened
    problems = check_params(p, limits)
    if problems:
        raise ParamsError(problems, "params")
    check_data(p)  # the data must be readable here too, before the job is accepted
    return p

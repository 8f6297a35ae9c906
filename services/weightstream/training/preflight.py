"""What ``weightstream run`` checks on this machine before it starts any role, beyond the params and
their data: that MemoryX can hold the model's weights, gradients and optimizer state here (``weightstream
run`` starts every role here), and the checkpoint the run would start from. ``jobs.admission`` runs these
as checks of its pipeline for ``weightstream validate`` and ``weightstream run`` alike, so a file that
validates is one that run accepts. ``finished_step`` tells a run that has nothing left to do before
anything starts.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from weightstream.checkpoint_layout import TRAINER_STATE, last_checkpoint
from weightstream.hf_checkpoint import StartCheckpointError
from weightstream.params import Params, Problem, model_def
from weightstream.params.schema import LanguageModelParams
from weightstream.params.size import num_layers, num_params
from weightstream.training.checkpoints import refuse_weights_only
from weightstream.training.errors import JobFailed
from weightstream.training.hf_start import check_start_checkpoint

__all__ = [
    "StartCheckpoint",
    "finished_step",
    "memory_problems",
    "resume_checkpoint",
    "size_text",
    "start_checkpoint",
]


def _optimizer_buffers(p: Params) -> tuple[int, str]:
    """float32 state buffers per parameter of the optimizer, and its name."""
    o = p.optimizer
    if o.optimizer_type == "sgd":
        return (1 if o.momentum else 0), "sgd"
    return 2, o.optimizer_type


def memory_problems(p: Params) -> list[Problem]:
    """MemoryX keeps, per parameter, the float32 weight, the summed gradient and the optimizer's state, in
    memory or (``memoryx_storage: disk``) in files under model_dir: more than this machine has is
    refused by name, with the count (Python integers, from the params alone: nothing is built)."""
    n = num_params(p.model)
    buffers, optimizer = _optimizer_buffers(p)
    need = n * 4 * (2 + buffers)
    rc = p.runconfig
    if rc.memoryx_storage == "disk":
        have = _free_disk(Path(rc.model_dir))
        where = f"free disk under {rc.model_dir} (memoryx_storage: disk)"
    else:
        have, where = _physical_memory(), "memory of this machine"
    if need <= have:
        return []
    # the key to change: the depth where one layer would fit, else the width (which every term grows with)
    depth_key = "num_hidden_layers" if isinstance(p.model, LanguageModelParams) else "depth"
    one_layer = num_params(p.model.model_copy(update={depth_key: 1})) * 4 * (2 + buffers)
    key = depth_key if one_layer <= have and num_layers(p.model) > 1 else "hidden_size"
    return [
        Problem(
            f"model.{key}",
            f"gives a model of {size_text(n)} parameters: {size_text(need, 'B')} of weights, gradients and "
            f"{optimizer} state in MemoryX ({4 * (2 + buffers)} bytes a parameter), more than the "
            f"{size_text(have, 'B')} of {where}; weightstream run starts every role on this machine",
            getattr(p.model, key),
        )
    ]


def size_text(x: int, unit: str = "") -> str:
    """A count as people read it: 123,456,789 below 1e12, 1.6e+25 beyond; bytes in KiB..EiB."""
    if unit == "B":
        for suffix, scale in (
            ("EiB", 2**60),
            ("PiB", 2**50),
            ("TiB", 2**40),
            ("GiB", 2**30),
            ("MiB", 2**20),
            ("KiB", 2**10),
        ):
            if scale <= x < 2**70:
                return f"{x / scale:.1f} {suffix}"
        return f"{x:,} bytes" if x < 2**10 else f"{x:.2g} bytes"
    return f"{x:,}" if x < 10**12 else f"{x:.2g}"


def _physical_memory() -> int:
    """Bytes of memory the roles can use: the machine's, or its container's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def _free_disk(path: Path) -> int:
    """Free bytes on the filesystem ``path`` is (or will be) on."""
    for d in [path, *path.resolve().parents]:
        if d.exists():
            return shutil.disk_usage(d).free
    return shutil.disk_usage("/").free


@dataclass(frozen=True)
class StartCheckpoint:
    """What the checkpoint a run starts from says before the run: its problems, the notes on a Hugging
    Face checkpoint it would start from (``check_start_checkpoint``'s, for ``validate`` to print), and
    the step of model_dir's newest checkpoint when the run has nothing left to do (``finished_step``)."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finished_step: int | None = None


def start_checkpoint(p: Params) -> StartCheckpoint:
    """The checkpoint the run starts from: its own newest (it must hold optimizer state to resume), or
    else the Hugging Face directory ``checkpoint_path`` names (it must fit the model)."""
    rc = p.runconfig
    resume = resume_checkpoint(p)
    if resume is not None:
        done = _finished(p, resume)
        if done is not None:
            return StartCheckpoint(finished_step=done)  # nothing to resume: run says so at once
        try:
            refuse_weights_only(resume[1])
        except JobFailed as e:
            return StartCheckpoint([Problem("runconfig.model_dir", str(e), rc.model_dir)])
        return StartCheckpoint()
    if rc.checkpoint_path is None:
        return StartCheckpoint()
    try:
        model = model_def(p)
    except ValueError:  # a shape the params' own checks refuse, with its key: nothing to compare yet
        return StartCheckpoint()
    try:
        notes = check_start_checkpoint(p, model, rc.checkpoint_path)
    except StartCheckpointError as e:
        return StartCheckpoint([Problem("runconfig.checkpoint_path", str(e), rc.checkpoint_path)])
    return StartCheckpoint(notes=notes)


def resume_checkpoint(p: Params) -> tuple[int, Path] | None:
    """(step, directory) of the checkpoint of model_dir a run resumes from, if it resumes."""
    rc = p.runconfig
    return last_checkpoint(Path(rc.model_dir)) if rc.autoload_last_checkpoint else None


def finished_step(p: Params) -> int | None:
    """The step of model_dir's newest checkpoint when it is at or past ``max_steps`` (the run has nothing
    left to do), else None. Reads one small JSON file: no role starts for it."""
    last = resume_checkpoint(p)
    return None if last is None else _finished(p, last)


def _finished(p: Params, last: tuple[int, Path]) -> int | None:
    """``finished_step`` for the newest checkpoint ``last`` (step, directory)."""
    try:
        step = int(json.loads((last[1] / TRAINER_STATE).read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        step = last[0]  # the directory's name says it too
    return step if step >= p.runconfig.max_steps else None

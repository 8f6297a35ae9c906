"""How a checkpoint lies on disk: its directory and file names, and what makes one complete.

The one copy of these rules, imported by ``training`` (which finishes checkpoints and resumes from them),
by MemoryX (which writes its shard's files) and by the job service (which lists and serves them).

    model_dir/
      .checkpoint_<step>.partial/        being written; never loaded, removed when found after a crash
      checkpoint_<step>/                 complete: renamed into place once everything is fsynced
        model.safetensors                one MemoryX shard, or
        model-0000i-of-0000K.safetensors + model.safetensors.index.json
        optimizer*.safetensors (+ index), config.json, trainer_state.json
        sparsity_masks*.safetensors (+ index)   a sparse model's masks (bool, True = kept), if any
      .recovery_<step>/                  a recovery snapshot: the same files but config.json, written
                                         between checkpoints while a run lasts, for fault recovery only
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "MASKS",
    "TRAINER_STATE",
    "checkpoint_dir",
    "checkpoint_files",
    "complete_checkpoints",
    "confine_checkpoint",
    "last_checkpoint",
    "partial_dir_path",
    "recovery_dir",
    "recovery_snapshots",
    "servable_file",
    "shard_file_name",
]

TRAINER_STATE = "trainer_state.json"  # written last: its presence marks a checkpoint complete
MASKS = "sparsity_masks"  # the file prefix of a sparse model's masks, beside "model" and "optimizer"
_DIR = re.compile(r"^checkpoint_(\d+)$")
_RECOVERY = re.compile(r"^\.recovery_(\d+)$")


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    return model_dir / f"checkpoint_{step}"


def recovery_dir(model_dir: Path, step: int) -> Path:
    return model_dir / f".recovery_{step}"


def recovery_snapshots(model_dir: Path) -> list[tuple[int, Path]]:
    """Every recovery snapshot directory in ``model_dir`` (complete or not) as (step, directory)."""
    if not model_dir.is_dir():
        return []
    return sorted((int(m.group(1)), d) for d in model_dir.iterdir() if (m := _RECOVERY.match(d.name)))


def partial_dir_path(model_dir: Path, step: int) -> Path:
    return model_dir / f".checkpoint_{step}.partial"


def shard_file_name(prefix: str, shard: int, num_shards: int) -> str:
    """``prefix`` (model or optimizer) file of ``shard`` of ``num_shards``, Hugging Face's names."""
    if num_shards == 1:
        return f"{prefix}.safetensors"
    return f"{prefix}-{shard + 1:05d}-of-{num_shards:05d}.safetensors"


def checkpoint_files(
    prefix: str, shards: Sequence[Sequence[tuple[str, int]]], max_bytes: int
) -> list[list[tuple[str, list[str]]]]:
    """Which file each tensor goes to, per MemoryX shard: ``shards[i]`` lists shard i's (tensor, bytes) in
    the order it writes them; they fill files of at most ``max_bytes`` (a larger tensor gets a file of its
    own, as ``save_pretrained(max_shard_size=...)`` does), numbered across all shards in order with
    Hugging Face's names. Coordinator and shards compute it alike from the params, so they agree."""
    grouped: list[list[list[str]]] = []
    for tensors in shards:
        files: list[list[str]] = []
        size = 0
        for name, nbytes in tensors:
            if not files or (size + nbytes > max_bytes and files[-1]):
                files.append([])
                size = 0
            files[-1].append(name)
            size += nbytes
        grouped.append(files or [[]])  # a shard with no tensors still writes its (empty) file
    total = sum(len(files) for files in grouped)
    out: list[list[tuple[str, list[str]]]] = []
    j = 0
    for files in grouped:
        out.append([])
        for names in files:
            out[-1].append((shard_file_name(prefix, j, total), names))
            j += 1
    return out


def complete_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """Every complete checkpoint in ``model_dir`` as (step, directory), by step."""
    found = []
    if model_dir.is_dir():
        for d in model_dir.iterdir():
            m = _DIR.match(d.name)
            if m and (d / TRAINER_STATE).is_file():
                found.append((int(m.group(1)), d))
    return sorted(found)


def last_checkpoint(model_dir: Path) -> tuple[int, Path] | None:
    """The complete checkpoint with the highest step, if any."""
    found = complete_checkpoints(model_dir)
    return found[-1] if found else None


def confine_checkpoint(model_dir: str | Path, directory: str | Path, step: int | None = None) -> Path:
    """``directory`` resolved, if it is one of ``model_dir``'s checkpoint directories: the partial one of
    ``step`` (being written) or, with ``step`` None, a complete one or a recovery snapshot (to resume
    from). Anything else, a
    symlink out included, raises PermissionError: a role reads and writes only its own job's checkpoints,
    whatever a request names."""
    root = Path(model_dir).resolve()
    real = Path(directory).resolve()
    if step is not None:
        ok = real == partial_dir_path(root, step)
    else:
        ok = real.parent == root and (_DIR.match(real.name) or _RECOVERY.match(real.name)) is not None
    if not ok:
        what = f"the partial checkpoint of step {step}" if step is not None else "a checkpoint"
        raise PermissionError(f"{directory} is not {what} of this job (under {root})")
    return real


def servable_file(model_dir: Path, step: int, name: str) -> Path | None:
    """The real path of file ``name`` of the complete checkpoint ``step``, or None unless it is a plain
    file (no symlink) directly inside the job's own ``checkpoint_<step>`` directory, itself no link: a job
    directory is written by training processes, and a link planted there must not make the service a
    reader of any file it can read."""
    path = checkpoint_dir(model_dir, step) / name
    try:
        real = path.resolve(strict=True)
        inside = checkpoint_dir(model_dir.resolve(strict=True), step)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if path.is_symlink() or real.parent != inside or not real.is_file():
        return None
    return real if (inside / TRAINER_STATE).is_file() else None

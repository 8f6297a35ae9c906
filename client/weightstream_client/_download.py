"""Where a downloaded checkpoint goes: ``<directory>/checkpoint_<step>/``, never merged with what is there.

A loader picks files by name: Hugging Face ``from_pretrained`` takes a ``model.safetensors`` before a
sharded ``model.safetensors.index.json``, so a single-file checkpoint left in a directory that a sharded one
is then merged into loads the old weights, silently. A download therefore refuses a directory that is not
empty unless asked to overwrite, and overwriting replaces the checkpoint's files as a set: every file of
the new checkpoint, and every file there that a checkpoint consists of (``CHECKPOINT_KINDS``) whether or not
the new one has it. Other files there (notes, a tokenizer put beside it) stay.

The files arrive in a hidden directory beside the target (same file system) and move into place only once
every one is complete, so a failed download leaves the target as it was.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "CHECKPOINT_KINDS",
    "CheckpointExistsError",
    "install_checkpoint",
    "is_checkpoint_file",
    "refuse_to_merge",
    "staging_dir",
]

# What a checkpoint of ours, or a Hugging Face model directory, consists of: weights (single or sharded,
# with their index), optimizer state, sparsity masks, configs and the trainer's state.
CHECKPOINT_KINDS = (
    "model*.safetensors",
    "optimizer*.safetensors",
    "sparsity_masks*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "*.bin.index.json",
    "config.json",
    "generation_config.json",
    "trainer_state.json",
)


class CheckpointExistsError(FileExistsError):
    """``path`` (a checkpoint's directory) already holds files, and overwriting was not asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(
            f"{path} already exists and is not empty: a file left there (a model.safetensors beside a "
            "sharded index, say) would be loaded instead of the download's; choose another directory, or "
            "pass overwrite=True to replace the checkpoint's files there"
        )


def is_checkpoint_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in CHECKPOINT_KINDS)


def refuse_to_merge(target: Path, overwrite: bool) -> None:
    """Raise CheckpointExistsError if ``target`` holds anything and ``overwrite`` is false;
    NotADirectoryError if it is something other than a directory. Called before anything is fetched."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise NotADirectoryError(f"{target} exists and is not a directory: the checkpoint cannot go there")
    if target.is_dir() and not overwrite and any(target.iterdir()):
        raise CheckpointExistsError(target)


def staging_dir(target: Path) -> Path:
    """A new hidden directory beside ``target`` for the files while they arrive."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))


def install_checkpoint(staged: Path, target: Path) -> None:
    """Move the complete files of ``staged`` into ``target`` (created if missing) and remove ``staged``.
    Checkpoint files in ``target`` that the new checkpoint lacks are removed first: a crash part-way
    leaves an incomplete checkpoint, which fails to load, never old weights beside new ones."""
    if not target.exists():
        staged.rename(target)
        return
    new = {p.name for p in staged.iterdir()}
    for old in target.iterdir():
        if old.name not in new and is_checkpoint_file(old.name) and (old.is_file() or old.is_symlink()):
            old.unlink()
    for name in sorted(new):
        os.replace(staged / name, target / name)
    shutil.rmtree(staged, ignore_errors=True)

"""Checkpoint retention (runconfig.keep_checkpoint_max): the newest N complete checkpoints stay, the one
just written always stays, and a crash in the middle of a deletion never leaves a checkpoint that looks
complete but is not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from weightstream.checkpoint_layout import TRAINER_STATE, complete_checkpoints, last_checkpoint
from weightstream.training.checkpoints import prune_checkpoints


def _checkpoint(model_dir: Path, step: int) -> Path:
    d = model_dir / f"checkpoint_{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x" * 64)
    (d / TRAINER_STATE).write_text(json.dumps({"global_step": step}))
    return d


def _steps(model_dir: Path) -> list[int]:
    return [s for s, _ in complete_checkpoints(model_dir)]


def test_the_newest_are_kept_and_the_oldest_removed_first(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        _checkpoint(tmp_path, step)
    removed = prune_checkpoints(tmp_path, 2, tmp_path / "checkpoint_8")
    assert removed == [2, 4] and _steps(tmp_path) == [6, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_6", "checkpoint_8"]  # nothing left over


def test_none_keeps_every_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _checkpoint(tmp_path, step)
    assert prune_checkpoints(tmp_path, None, tmp_path / "checkpoint_3") == []
    assert _steps(tmp_path) == [1, 2, 3]


def test_the_checkpoint_just_written_is_never_removed(tmp_path: Path) -> None:
    """A job restarted from scratch (autoload off) writes step 8 beside an earlier run's 40 and 48."""
    for step in (40, 48):
        _checkpoint(tmp_path, step)
    just = _checkpoint(tmp_path, 8)
    assert prune_checkpoints(tmp_path, 1, just) == [40]
    assert _steps(tmp_path) == [8, 48]


def test_partial_checkpoints_are_not_counted_or_touched(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _checkpoint(tmp_path, step)
    partial = tmp_path / ".checkpoint_4.partial"
    partial.mkdir()
    assert prune_checkpoints(tmp_path, 1, tmp_path / "checkpoint_3") == [1, 2]
    assert partial.is_dir()


def test_a_crash_while_deleting_leaves_nothing_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint is renamed aside before its files go: if the deletion dies half way, a resume
    still picks a whole checkpoint, and the next pass removes what was left."""
    for step in (1, 2, 3):
        _checkpoint(tmp_path, step)
    real_rmtree = shutil.rmtree

    def die_half_way(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / "model.safetensors").unlink()  # some files gone, trainer_state.json still there
        raise OSError("power lost")

    monkeypatch.setattr(shutil, "rmtree", die_half_way)
    with pytest.raises(OSError, match="power lost"):
        prune_checkpoints(tmp_path, 1, tmp_path / "checkpoint_3")
    assert _steps(tmp_path) == [2, 3]  # checkpoint_1 is no longer complete, whatever is left of it
    assert last_checkpoint(tmp_path) == (3, tmp_path / "checkpoint_3")
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert prune_checkpoints(tmp_path, 1, tmp_path / "checkpoint_3") == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_3"]

"""Durable writes: other users cannot read what they write, and the rename reaches the disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weightstream.storage_io import write_bytes_durably, write_text_durably


def test_files_are_not_world_readable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write_bytes_durably(tmp_path / "model.safetensors", b"weights")
        stale = tmp_path / "params.yaml.partial"  # left by a crash, world-readable
        stale.write_text("old")
        stale.chmod(0o666)
        write_text_durably(tmp_path / "params.yaml", "new")
    finally:
        os.umask(old)
    for name in ("model.safetensors", "params.yaml"):
        mode = (tmp_path / name).stat().st_mode & 0o777
        assert mode == 0o640, f"{name}: {oct(mode)}"
    assert (tmp_path / "params.yaml").read_text() == "new" and not stale.exists()


def test_the_directory_is_fsynced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new name lives in the directory: without fsyncing it, a power loss can bring the old file back.
    Every fsync is recorded (and done) with what it was on: the file, then its directory after the rename."""
    calls: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), (tmp_path / "f.json").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_text_durably(tmp_path / "f.json", "{}")
    assert calls == [(str(tmp_path / "f.json.partial"), False), (str(tmp_path), True)]

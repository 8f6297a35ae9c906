"""Durable small-file writes shared by every role: temp name, flush, fsync, rename."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_bytes_durably", "write_text_durably"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    """A reader sees the old file or the whole new one, never half of it, even after a crash."""
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text_durably(path: Path, text: str) -> None:
    write_bytes_durably(path, text.encode("utf-8"))

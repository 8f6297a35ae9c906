"""Durable small-file writes shared by every role: temp name, flush, fsync, rename, fsync the directory."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FILE_MODE", "fsync_dir", "write_bytes_durably", "write_text_durably"]

# Checkpoints, params and ready files are the job's own: never readable by other users of the machine.
# Group-readable, because a cluster may run the coordinator and the role pods under different uids that
# share a group (fsGroup) on one volume; the service's umask (see `weightstream serve`) applies on top.
FILE_MODE = 0o640


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """A reader sees the old file or the whole new one, never half of it, even after a crash; once this
    returns, the new file survives a power loss (its directory entry is fsynced too). ``mode``: before
    the umask (a user's own file, such as a tokenizer, takes 0o666 like any file they write)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.unlink(missing_ok=True)  # a leftover keeps its old mode through O_TRUNC: start from a new inode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written stays beside the file
        raise
    fsync_dir(path.parent)  # the rename lives in the directory: without this a crash can undo it


def write_text_durably(path: Path, text: str, mode: int = FILE_MODE) -> None:
    write_bytes_durably(path, text.encode("utf-8"), mode)

"""A job's logs as one tar.gz, built while it streams: ``run.log``, every role's ``logs/*.log``,
``params.yaml`` and ``metrics.jsonl``, under a top directory named after the job.

A job's directory is written by its training processes, so nothing in it is trusted: only plain files
directly in ``model_dir`` or in its ``logs/`` directory go in, each opened with ``O_NOFOLLOW`` relative to
directory descriptors that were themselves opened without following a link (a symlink, a FIFO or a
device planted there is left out, and the service never reads a file elsewhere through one). The archive
is bounded: at most ``MAX_FILE_BYTES`` of each file (a longer one keeps its end, where the newest lines and
a failure are), ``MAX_EXPORT_BYTES`` of all files together and ``MAX_MEMBERS`` files; what was cut is
listed in a ``TRUNCATED.txt`` member. Memory stays at about one chunk whatever the sizes.
"""

from __future__ import annotations

import os
import stat
import tarfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CHUNK_BYTES",
    "MAX_EXPORT_BYTES",
    "MAX_FILE_BYTES",
    "MAX_MEMBERS",
    "TOP_FILES",
    "job_log_archive",
]

TOP_FILES = ("run.log", "params.yaml", "metrics.jsonl")  # in model_dir itself, in this order
MAX_FILE_BYTES = 64 << 20  # a role that logged for days: its last 64 MiB say what happened in the end
MAX_EXPORT_BYTES = 256 << 20  # before compression; text logs shrink to a tenth or less
MAX_MEMBERS = 4096  # a header each: thousands of empty files planted in logs/ must not grow it unbounded
CHUNK_BYTES = 1 << 20
_BLOCK = tarfile.BLOCKSIZE  # 512: every header and every member's data fill whole blocks
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY


def job_log_archive(job_id: str, model_dir: Path) -> Iterator[bytes]:
    """The gzip-compressed tar of job ``job_id``'s logs in ``model_dir``, as chunks of bytes. A missing
    file is left out; a missing (or linked) ``model_dir`` gives an archive with no files."""
    gz = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: a gzip header and trailer
    written = 0
    for piece in _tar(job_id, model_dir):
        written += len(piece)
        if out := gz.compress(piece):
            yield out
    # a tar ends with two zero blocks, padded to tar's record size as tarfile and GNU tar write it
    end = 2 * _BLOCK + (-(written + 2 * _BLOCK) % tarfile.RECORDSIZE)
    yield gz.compress(b"\0" * end) + gz.flush()


def _tar(job_id: str, model_dir: Path) -> Iterator[bytes]:
    """The tar stream before compression, less its end blocks."""
    top = _open_dir(str(model_dir), None)
    if top is None:
        return
    logs = _open_dir("logs", top)
    budget, members, cut = MAX_EXPORT_BYTES, 0, []
    try:
        candidates = [(top, name, name) for name in TOP_FILES]
        if logs is not None:
            candidates += [(logs, n, f"logs/{n}") for n in sorted(os.listdir(logs)) if n.endswith(".log")]
        for i, (dir_fd, name, arcname) in enumerate(candidates):
            if members == MAX_MEMBERS:
                cut.append(f"{len(candidates) - i} more files left out, from {arcname} on")
                break
            fd = _open_file(name, dir_fd)
            if fd is None:  # missing, a link, or no plain file
                continue
            try:
                st = os.fstat(fd)
                size = st.st_size
                kept = min(size, MAX_FILE_BYTES, budget)
                if size and not kept:
                    cut.append(f"{arcname}: left out ({size} bytes)")
                    continue
                if kept < size:
                    cut.append(f"{arcname}: its last {kept} of {size} bytes")
                yield _header(f"{job_id}/{arcname}", kept, st.st_mtime)
                yield from _data(fd, size - kept, kept)
            finally:
                os.close(fd)
            budget -= kept
            members += 1
        if cut:
            limits = f"{MAX_FILE_BYTES} bytes a file, {MAX_EXPORT_BYTES} in all, {MAX_MEMBERS} files"
            note = "\n".join([f"Cut to keep the export within its limits ({limits}):", *cut, ""]).encode()
            yield _header(f"{job_id}/TRUNCATED.txt", len(note), time.time())
            yield note + b"\0" * (-len(note) % _BLOCK)
    finally:
        for fd in (logs, top):
            if fd is not None:
                os.close(fd)


def _open_dir(path: str, dir_fd: int | None) -> int | None:
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:  # missing, a link (ELOOP), or not a directory
        return None


def _open_file(name: str, dir_fd: int) -> int | None:
    """``name`` in ``dir_fd`` opened for reading if it is a plain file (not through a link), else None."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def _header(name: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o640, tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def _data(fd: int, offset: int, size: int) -> Iterator[bytes]:
    """``size`` bytes of ``fd`` from ``offset``, then zeros to a whole block. A file cut shorter since
    its size was read (a log rotated away) is filled with zeros: the header has promised ``size``."""
    done = 0
    while done < size:
        chunk = os.pread(fd, min(CHUNK_BYTES, size - done), offset + done)
        if not chunk:
            chunk = b"\0" * min(CHUNK_BYTES, size - done)
        done += len(chunk)
        yield chunk
    yield b"\0" * (-size % _BLOCK)

"""Where a MemoryX shard keeps its float32 tensors: in RAM, or in files on disk read and written in blocks.

Both stores hold flat float32 tensors under string keys (a weight, an optimizer state buffer, a gradient)
and offer the same operations; the shard's logic is written once against them:

- ``put`` / ``zeros`` create a tensor; ``get`` returns all of it; ``drop`` forgets it;
- ``blocks`` yields it in consecutive flat blocks (for sums of squares and for writing checkpoints);
- ``update`` runs an elementwise function over several tensors of one shape, block by block, and writes
  back the ones it names. Elementwise float32 arithmetic does not depend on how an array is cut into
  blocks, so the disk store's results are bitwise those of the memory store.

Where the two differ in what the shard may do with them, the store says so itself rather than the shard
asking which store it has: ``resident`` (arrays in this process, so another thread may sum them),
``arena`` (weights in memfds that co-located workers map), ``recycle`` (a buffer wanted again next step:
kept in RAM, its file freed on disk) and ``log_io`` (what a step cost the disk).

``DiskStore`` uses plain ``pread``/``pwrite`` on one file per tensor, never ``mmap``: what a shard holds
resident is then its block buffers and the tensors it is sending or receiving, whatever the model's size,
and the kernel's page cache (reclaimable, not counted in any process's resident memory) does the caching.
Zero tensors (Adam's state before the first step) are sparse files: ``ftruncate`` costs no disk until
written. Durability: the files are scratch and are never fsynced; a crash loses them, and the job
recovers from its last checkpoint or recovery snapshot, which are written durably (``storage``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

import numpy as np

from weightstream.transport.shm import SharedArena

__all__ = ["BLOCK_ELEMENTS", "DiskStore", "MemoryStore", "TensorStore"]

# 4 Mi float32 = 16 MiB per block and buffer: large enough that a pread/pwrite costs little per byte, small
# enough that an update over four tensors (weight, gradient, two Adam buffers) holds 64 MiB at most. A
# multiple of numerics.optim.SUM_BLOCK, so block sums add up exactly as the memory store's do.
BLOCK_ELEMENTS = 1 << 22
_F32 = np.dtype(np.float32)

log = logging.getLogger("weightstream.memoryx")


class TensorStore(ABC):
    """Flat float32 tensors by key. Shapes are the caller's business: ``get`` returns ``shape``d arrays."""

    # Whether ``get`` and ``blocks`` give views of arrays held in this process, which stay valid while
    # another thread reads them and cost no I/O: then a shard sums gradients in the background.
    resident: bool = False
    # the memfds the weights live in, which co-located workers map instead of receiving copies; also where
    # a shard keeps its sparse tensors' indexes (None: the weights are sent as bytes)
    arena: SharedArena | None = None

    def __init__(self) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.shapes

    @abstractmethod
    def put(self, key: str, value: np.ndarray) -> None:
        """Store ``value`` (float32) under ``key``; the memory store keeps the array itself."""

    @abstractmethod
    def zeros(self, key: str, shape: tuple[int, ...]) -> None: ...

    @abstractmethod
    def get(self, key: str) -> np.ndarray:
        """The whole tensor: the stored array itself (memory) or a fresh copy read from its file (disk)."""

    @abstractmethod
    def blocks(self, key: str) -> Iterator[np.ndarray]:
        """The tensor flat, in consecutive blocks of ``BLOCK_ELEMENTS`` (the last one shorter)."""

    @abstractmethod
    def update(
        self, keys: Sequence[str], fn: Callable[[list[np.ndarray]], None], write: Sequence[str]
    ) -> None:
        """``fn`` over flat blocks of the tensors ``keys`` (same number of elements), in place; the tensors
        in ``write`` keep what ``fn`` left in their blocks."""

    @abstractmethod
    def drop(self, key: str) -> None: ...

    @abstractmethod
    def recycle(self, key: str) -> None:
        """Done with ``key`` (if it exists) for this step, but a tensor of that shape is wanted there again
        next step (a tied tensor's summed gradient): the memory store keeps the array (no new allocation
        next step), the disk store frees its file (its disk is needed more)."""

    @abstractmethod
    def log_io(self, step: int) -> None:
        """Log what the store has cost the disk so far, after update ``step`` (1-based)."""

    def close(self) -> None:
        self.shapes.clear()


class MemoryStore(TensorStore):
    resident = True

    def __init__(self, arena: SharedArena | None = None, shared: Collection[str] = ()) -> None:
        """With ``arena``, the tensors ``shared`` (the weights) live in memfds of their own, which
        co-located workers map instead of receiving copies (transport/shm.py)."""
        super().__init__()
        self.arrays: dict[str, np.ndarray] = {}
        self.arena, self.shared = arena, frozenset(shared) if arena is not None else frozenset()

    def put(self, key: str, value: np.ndarray) -> None:
        if key in self.shared:
            assert self.arena is not None
            arr = self.arena.empty(value.shape)
            arr[...] = value
            self._release(key)
            self.arrays[key] = arr
        else:
            self.arrays[key] = np.ascontiguousarray(value, dtype=np.float32)
        self.shapes[key] = value.shape

    def _release(self, key: str) -> None:
        old = self.arrays.get(key)
        if old is not None and key in self.shared and self.arena is not None:
            self.arena.release(old)

    def zeros(self, key: str, shape: tuple[int, ...]) -> None:
        self.put(key, np.zeros(shape, dtype=np.float32))

    def get(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def blocks(self, key: str) -> Iterator[np.ndarray]:
        flat = self.arrays[key].reshape(-1)
        for start in range(0, flat.size, BLOCK_ELEMENTS):
            yield flat[start : start + BLOCK_ELEMENTS]

    def update(
        self, keys: Sequence[str], fn: Callable[[list[np.ndarray]], None], write: Sequence[str]
    ) -> None:
        fn([self.arrays[k].reshape(-1) for k in keys])  # the whole arrays: one block

    def drop(self, key: str) -> None:
        self._release(key)
        self.arrays.pop(key, None)
        self.shapes.pop(key, None)

    def recycle(self, key: str) -> None:
        pass  # kept: the next step's sum is written over it (grad_sums.add_parts)

    def log_io(self, step: int) -> None:
        pass  # no disk

    def close(self) -> None:
        super().close()
        self.arrays.clear()
        if self.arena is not None:
            self.arena.close()


class DiskStore(TensorStore):
    """One file per tensor under ``directory`` (which it owns: emptied when opened, removed on close)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # an earlier process's scratch for the same shard
        directory.mkdir(parents=True)
        self.bytes_read = 0
        self.bytes_written = 0
        self.io_seconds = 0.0  # in pread/pwrite: what the shard waited for the disk (or the page cache)
        self._fds: dict[str, int] = {}
        self._buffers: list[np.ndarray] = []  # block buffers, reused by every update

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.f32"

    def _open(self, key: str, shape: tuple[int, ...]) -> int:
        self.drop(key)
        fd = os.open(self._path(key), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._fds[key], self.shapes[key] = fd, tuple(shape)
        return fd

    def put(self, key: str, value: np.ndarray) -> None:
        fd = self._open(key, value.shape)
        self._pwrite(fd, np.ascontiguousarray(value, dtype=np.float32).reshape(-1), 0)

    def zeros(self, key: str, shape: tuple[int, ...]) -> None:
        fd = self._open(key, shape)
        os.ftruncate(fd, int(np.prod(shape, dtype=np.int64)) * _F32.itemsize)  # a hole reads as zeros

    def get(self, key: str) -> np.ndarray:
        out = np.empty(self.shapes[key], dtype=np.float32)
        self._pread(self._fds[key], out.reshape(-1), 0)
        return out

    def _size(self, key: str) -> int:
        return int(np.prod(self.shapes[key], dtype=np.int64))

    def blocks(self, key: str) -> Iterator[np.ndarray]:
        fd, n = self._fds[key], self._size(key)
        buf = np.empty(min(n, BLOCK_ELEMENTS), dtype=np.float32)
        for start in range(0, n, BLOCK_ELEMENTS):
            block = buf[: min(BLOCK_ELEMENTS, n - start)]
            self._pread(fd, block, start)
            yield block

    def update(
        self, keys: Sequence[str], fn: Callable[[list[np.ndarray]], None], write: Sequence[str]
    ) -> None:
        n = self._size(keys[0])
        if any(self._size(k) != n for k in keys):
            raise ValueError(f"update over tensors of different sizes: {keys}")
        while len(self._buffers) < len(keys):
            self._buffers.append(np.empty(BLOCK_ELEMENTS, dtype=np.float32))
        for start in range(0, n, BLOCK_ELEMENTS):
            count = min(BLOCK_ELEMENTS, n - start)
            blocks = [buf[:count] for buf in self._buffers[: len(keys)]]
            for k, b in zip(keys, blocks, strict=True):
                self._pread(self._fds[k], b, start)
            fn(blocks)
            for k, b in zip(keys, blocks, strict=True):
                if k in write:
                    self._pwrite(self._fds[k], b, start)

    def drop(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        self.shapes.pop(key, None)
        if fd is not None:
            os.close(fd)
            self._path(key).unlink(missing_ok=True)  # frees its disk at once (a gradient: every step)

    def recycle(self, key: str) -> None:
        self.drop(key)

    def log_io(self, step: int) -> None:
        # the format is read back by bench/beyond_ram.py
        log.info(
            "step %d applied: disk read %d B, written %d B, %.3f s in I/O (totals), %d B on disk",
            step,
            self.bytes_read,
            self.bytes_written,
            self.io_seconds,
            self.disk_bytes(),
        )

    def close(self) -> None:
        for key in list(self._fds):
            self.drop(key)
        super().close()
        self._buffers.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def disk_bytes(self) -> int:
        """Bytes the files occupy on disk now (holes not counted)."""
        return sum(os.fstat(fd).st_blocks * 512 for fd in self._fds.values())

    # -- whole-buffer positional I/O (a single pread/pwrite may move fewer bytes than asked) ------------
    def _pread(self, fd: int, out: np.ndarray, start: int) -> None:
        view, offset = out.data.cast("B"), start * _F32.itemsize
        done, t0 = 0, time.perf_counter()
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got == 0:  # a hole past the end of a file extended by ftruncate never gets here
                raise OSError(f"short read from {fd}: {done} of {len(view)} bytes")
            done += got
        self.bytes_read += done
        self.io_seconds += time.perf_counter() - t0

    def _pwrite(self, fd: int, data: np.ndarray, start: int) -> None:
        view, offset = data.data.cast("B"), start * _F32.itemsize
        done, t0 = 0, time.perf_counter()
        while done < len(view):
            done += os.pwritev(fd, [view[done:]], offset + done)
        self.bytes_written += done
        self.io_seconds += time.perf_counter() - t0

"""The shared-memory data plane of co-located roles: tensor bytes lie in memfds, gRPC carries the header.

Over gRPC on loopback every hop costs the CPU a serialisation into HTTP/2 frames, two kernel copies, a
copy into a receive buffer and a checksum pass, and on a small machine that CPU is taken from the
workers' compute. Between roles on one host (the local backend) the sender instead leaves the bytes in a
memfd and sends only the header naming ``(pid, fd, offset)``; the receiver maps that memfd read-only and
computes on the mapping: no copy at all for weights, which MemoryX keeps in memfds for good, and one copy
for a gradient (into a memfd the pusher holds open until the call returns). A SwarmX relay forwards the
header alone. The receiver still checks every tensor's checksum (XXH3-64), end to end, as on the gRPC path.

Why memfd + ``/proc/<pid>/fd/<fd>`` rather than named ``/dev/shm`` segments: a memfd has no name that can
outlive its processes. It lives while its owner holds the fd or anyone maps it, so a SIGKILLed role leaks
nothing, and a receiver's mapping stays valid after the sender lets go. Who may open it: the kernel lets
only a process of the same user (with ptrace read access) open another's ``/proc/<pid>/fd``. Which memfds
a role opens: only those whose name carries its job's tag, a hash of the role credential (never sent), so
an authenticated peer cannot point it at another job's memory or at any other file; and every mapping is
read-only, so a faulty receiver cannot corrupt the sender's weights.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import mmap
import os
import resource
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from weightstream.transport.errors import ProtocolError

__all__ = [
    "KEPT_GRADIENT_BYTES",
    "REFERENCES_ONLY",
    "KeptScratch",
    "Location",
    "SharedArena",
    "attach",
    "job_tag",
    "locate",
    "map_whole",
    "open_peer_memfd",
    "scratch",
]

_PREFIX = "weightstream-"


def job_tag(credential: str) -> str:
    """The name every memfd of a job carries: derived from the role credential, so only the job's roles
    know it, and revealing it (it shows in /proc to the same user) reveals nothing of the credential."""
    return hashlib.sha256(b"weightstream-shm\0" + credential.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Location:
    """Where an array's bytes lie: memfd ``fd`` of process ``pid``, from ``offset``."""

    pid: int
    fd: int
    offset: int


class _Regions:
    """The memfd mappings of this process by address, with the memfd each one shows, so that an array
    living in one (a weight MemoryX owns, a gradient a relay received) is sent by reference, not copied."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._regions: dict[int, tuple[int, int, int]] = {}  # start -> (end, pid, fd)

    def add(self, start: int, end: int, pid: int, fd: int) -> None:
        with self._lock:
            bisect.insort(self._starts, start)
            self._regions[start] = (end, pid, fd)

    def remove(self, start: int) -> None:
        with self._lock:
            if self._regions.pop(start, None) is not None:
                self._starts.pop(bisect.bisect_left(self._starts, start))

    def find(self, address: int, nbytes: int) -> Location | None:
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            start = self._starts[i]
            end, pid, fd = self._regions[start]
            return Location(pid, fd, address - start) if address + nbytes <= end else None


_REGIONS = _Regions()


def locate(arr: np.ndarray) -> Location | None:
    """The memfd location of a C-contiguous array living in a memfd mapping of this process, else None.

    For a mapping this process received, the location is the sender's, valid only while the sender holds
    that fd: during the call that delivered it. Relays send received tensors by reference only within it
    (a single-child SwarmX node passing a gradient up); anything kept longer is copied before it is sent."""
    if not arr.flags.c_contiguous or arr.nbytes == 0:
        return None
    return _REGIONS.find(arr.ctypes.data, arr.nbytes)


# libc's mmap, not Python's: mmap.mmap keeps a dup of the fd for as long as the mapping lives (until
# Python 3.13's trackfd=False), so every mapping would hold its memfd open and a lease could not close it.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _unmap(start: int, size: int) -> None:
    _REGIONS.remove(start)
    _libc.munmap(start, size)


def _map(fd: int, size: int, pid: int, origin_fd: int, writable: bool) -> np.ndarray:
    """Map ``size`` bytes of memfd ``fd`` as a uint8 array; unmapped once no view of it is left."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    # MAP_POPULATE: build the page tables now, in one call, instead of one fault per page on first touch
    start = _libc.mmap(None, size, prot, mmap.MAP_SHARED | mmap.MAP_POPULATE, fd, 0)
    if start is None or start == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    owner = (ctypes.c_char * size).from_address(start)
    _REGIONS.add(start, start + size, pid, origin_fd)
    weakref.finalize(owner, _unmap, start, size)
    view = memoryview(owner).cast("B")
    # read-only all the way down: numpy refuses to make a view of a read-only buffer writable again
    return np.frombuffer(view if writable else view.toreadonly(), dtype=np.uint8)


def open_peer_memfd(pid: int, fd: int, tag: str) -> int:
    """An fd of process ``pid``'s memfd ``fd``, which must carry this job's ``tag``; errors name it."""
    where = f"/proc/{pid}/fd/{fd}"
    try:
        target = os.readlink(where)
        if not target.startswith(f"/memfd:{_PREFIX}{tag} "):
            raise ProtocolError(f"shared memory {where} is not one of this job's memfds ({target!r})")
        return os.open(where, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ProtocolError(
            f"cannot open shared memory {where}: {e.strerror} (are the roles on one host? "
            "runconfig.data_plane: grpc sends the bytes over gRPC instead)"
        ) from e


def map_whole(handle: int, size: int, pid: int, fd: int) -> np.ndarray:
    """Read-only uint8 view of all ``size`` bytes of the memfd open as ``handle`` (process ``pid``'s ``fd``,
    named in errors); the mapping keeps the memory once ``handle`` is closed."""
    return _map(handle, size, pid, fd, writable=False) if size else np.empty(0, dtype=np.uint8)


def attach(pid: int, fd: int, tag: str) -> np.ndarray:
    """Read-only uint8 view of the whole of process ``pid``'s memfd ``fd``, which must carry this job's
    ``tag``. Errors name the memfd; no fd is left open (the mapping keeps the memory)."""
    handle = open_peer_memfd(pid, fd, tag)
    try:
        return map_whole(handle, os.fstat(handle).st_size, pid, fd)
    finally:
        os.close(handle)


def _raise_fd_limit() -> None:
    """Each memfd MemoryX owns is an open file: allow as many as the hard limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class SharedArena:
    """This process's memfds for one job: arrays other roles of the job can map by reference."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # mapping start -> fd held open for it
        _raise_fd_limit()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
        """A writable array of ``shape`` in a memfd of its own, open until ``release`` or ``close``."""
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return self._new(max(nbytes, 1))[:nbytes].view(dt).reshape(shape)

    def _new(self, nbytes: int) -> np.ndarray:
        fd = os.memfd_create(_PREFIX + self.tag, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            buf = _map(fd, nbytes, os.getpid(), fd, writable=True)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._fds[buf.ctypes.data] = fd
        return buf

    def release(self, arr: np.ndarray) -> None:
        """Close the memfd ``arr`` lives in (made by ``empty``): receivers' mappings stay valid, new
        receivers can no longer open it; the memory goes once the last mapping does."""
        loc = locate(arr)
        if loc is None or loc.pid != os.getpid():
            return
        with self._lock:
            start = arr.ctypes.data - loc.offset
            fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)

    @contextmanager
    def lease(self) -> Iterator[_Lease]:
        """Scratch memfds for one call: what is allocated is closed when the block ends (after the call
        that sent its location has returned, so every receiver has mapped it by then)."""
        lease = _Lease(self)
        try:
            yield lease
        finally:
            for buf in lease.bufs:
                self.release(buf)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


class _Lease:
    def __init__(self, arena: SharedArena) -> None:
        self.arena = arena
        self.bufs: list[np.ndarray] = []

    def alloc(self, nbytes: int) -> np.ndarray:
        """A writable uint8 buffer of ``nbytes`` (64-byte aligned) in a fresh memfd."""
        buf = self.arena._new(max(nbytes, 1))[:nbytes]
        self.bufs.append(buf)
        return buf


# Gradient memfds a sender keeps for reuse, at most, by MemoryX's storage. With the memory store MemoryX
# keeps what it receives as the mapping, so the kept pages are the very pages MemoryX holds the gradients
# in while it applies the update: every unit's at once, whether kept or fresh. Keeping them adds nothing to
# the job's peak memory, only keeps it between updates: up to 1.5 GiB, a 384M-parameter model's whole
# gradient. With the disk store MemoryX copies gradients into files and kept pages would be the sender's
# alone: none are kept (fresh memfds, freed after each push).
KEPT_GRADIENT_BYTES = {"memory": 1536 << 20, "disk": 0}


class KeptScratch:
    """Scratch memfds a sender keeps from call to call, one per key (a worker: one per unit it pushes the
    gradients of), up to ``max_bytes`` in all; past that, or while a key's buffer is in use by another
    call, a call gets fresh memfds as ``SharedArena.lease`` gives.

    Why: a fresh memfd costs the kernel a page allocation and a zeroing per 4 KiB page, and the receiver
    an unmapping that frees them again: 27 ms to place 28 MB of gradients in a new memfd against 2.5 ms to
    copy them into a kept one (measured here), ~0.3 s of CPU a step at GPT-2 d768/L12, taken from the
    worker's compute on a small machine.

    Why it is safe to write a kept buffer again: a receiver may keep reading what a call placed in it after
    the call returns (MemoryX's memory store keeps a pushed gradient as the mapping itself), but only until
    that step's update has been applied, and the coordinator starts no step before the previous step's
    update is done on every MemoryX shard. A worker pushes a unit's gradient once per step, so the next
    write of its buffer comes a whole step later. A new configuration after a fault builds new senders,
    hence new buffers: an abandoned attempt can never write into what the new one sent."""

    def __init__(self, arena: SharedArena, max_bytes: int) -> None:
        self.arena, self.max_bytes = arena, max_bytes
        self._lock = threading.Lock()
        self._bufs: dict[object, np.ndarray] = {}
        self._busy: set[object] = set()
        self.kept_bytes = 0

    @contextmanager
    def lease(self, key: object) -> Iterator[_Kept]:
        """Scratch for one call sending under ``key``: the key's kept buffer where it may be used, fresh
        memfds (closed when the block ends) for anything else."""
        with self._lock:
            mine = key not in self._busy  # the same key in two calls at once: the second gets fresh memfds
            self._busy.add(key)
        scratch = _Kept(self, key if mine else None)
        try:
            yield scratch
        finally:
            for buf in scratch.fresh:
                self.arena.release(buf)
            if mine:
                with self._lock:
                    self._busy.discard(key)

    def _buffer(self, key: object, nbytes: int) -> np.ndarray | None:
        """The key's kept buffer, grown to ``nbytes`` if need be; None past ``max_bytes``."""
        with self._lock:
            buf = self._bufs.get(key)
            if buf is not None and len(buf) >= nbytes:
                return buf[:nbytes]
            grow = nbytes - (len(buf) if buf is not None else 0)
            if self.kept_bytes + grow > self.max_bytes:
                return None
            self.kept_bytes += grow
        new = self.arena._new(max(nbytes, 1))
        with self._lock:
            old, self._bufs[key] = self._bufs.get(key), new
        if old is not None:
            self.arena.release(old)
        return new[:nbytes]

    def close(self) -> None:
        with self._lock:
            bufs, self._bufs, self.kept_bytes = list(self._bufs.values()), {}, 0
        for buf in bufs:
            self.arena.release(buf)


class _Kept:
    """One call's scratch from ``KeptScratch``: its first allocation in the key's kept buffer (if the call
    holds the key and the budget allows), any other in a fresh memfd."""

    def __init__(self, owner: KeptScratch, key: object | None) -> None:
        self.owner, self.key = owner, key
        self.fresh: list[np.ndarray] = []

    def alloc(self, nbytes: int) -> np.ndarray:
        key, self.key = self.key, None  # a second allocation of the call must not share the first's bytes
        buf = self.owner._buffer(key, nbytes) if key is not None else None
        if buf is None:
            buf = self.owner.arena._new(max(nbytes, 1))[:nbytes]
            self.fresh.append(buf)
        return buf


class _ReferencesOnly:
    """Scratch for a sender whose tensors all lie in memfds already (MemoryX's weights): nothing is copied,
    and a tensor that is not in one is a bug, not a reason to copy silently."""

    def alloc(self, nbytes: int) -> np.ndarray:
        raise ProtocolError("a tensor to be sent by reference does not lie in shared memory")


REFERENCES_ONLY = _ReferencesOnly()


def scratch(arena: SharedArena | None) -> AbstractContextManager[_Lease | None]:
    """``arena.lease()``, or None off the shared-memory plane: ``with scratch(a) as s: tensor_messages(...,
    shm=s)`` then sends over shared memory exactly when the job uses it."""
    return arena.lease() if arena is not None else nullcontext(None)

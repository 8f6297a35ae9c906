"""Mappings of other processes' memfds kept from call to call (the shared-memory plane's receivers)."""

from __future__ import annotations

import os
import threading

import numpy as np

from weightstream.transport.shm import map_whole, open_peer_memfd

__all__ = ["MappingCache"]


class MappingCache:
    """``attach`` that keeps up to ``capacity`` mappings from call to call (least recently used first out).

    Why: a worker maps every weight's memfd at each fetch (a unit's dozen tensors, forward and again for
    backward) and unmaps it after computing: at GPT-2 d512/L4 the mapping alone (``MAP_POPULATE`` of
    ~160 MB of page tables a step) cost its prefetch thread ~11 ms a step, and every unmapping interrupts
    the other compute core to flush its TLB. MemoryX keeps a weight in the same memfd from step to step,
    so the mapping can stay. Every call still opens the memfd (the job's tag is checked each time) and
    compares its identity (device, inode, size) with the kept mapping's: a memfd replaced under the same
    fd number is mapped anew. A kept mapping keeps its memfd's inode alive, so its number cannot be
    reused while it is kept. What is read through a kept mapping is what the sender's memfd holds now
    (a shared mapping), and the receiver checks the checksum on every call as before.

    The cost: the kept mappings' pages count in the receiver's resident memory (they are the sender's
    pages, not copies), and a memfd the sender has let go stays allocated until its mapping is pushed
    out, at most ``capacity`` other memfds later."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._maps: dict[tuple[int, int], tuple[tuple[int, int, int], np.ndarray]] = {}
        self.hits = self.misses = 0

    def attach(self, pid: int, fd: int, tag: str) -> np.ndarray:
        handle = open_peer_memfd(pid, fd, tag)
        try:
            st = os.fstat(handle)
            ident = (st.st_dev, st.st_ino, st.st_size)
            with self._lock:
                kept = self._maps.pop((pid, fd), None)
                if kept is not None and kept[0] == ident:
                    self._maps[(pid, fd)] = kept  # now the most recently used
                    self.hits += 1
                    return kept[1]
            mapping = map_whole(handle, st.st_size, pid, fd)
        finally:
            os.close(handle)
        with self._lock:
            self.misses += 1
            self._maps[(pid, fd)] = (ident, mapping)
            while len(self._maps) > self.capacity:
                del self._maps[next(iter(self._maps))]  # the least recently used
        return mapping

    def close(self) -> None:
        with self._lock:
            self._maps.clear()

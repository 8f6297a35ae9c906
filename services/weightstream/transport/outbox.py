"""A role's outbox: the payloads its streams name as bulk transfers, waiting for their readers.

A payload is parked under a random 128-bit id, for a number of readers, until a deadline: a pushed
stream's is let go when the push returns, an answered stream's once its reader has fetched it, any
other's at its deadline (its reader is gone: a fault, a stale step). The outbox holds at most
``max_entries``: beyond, it refuses and the sender goes inline over gRPC, so memory stays bounded. A relay
parks a payload while it still arrives (``Filling``): readers are served what is in and wait for the rest.
The wire that serves an outbox is transport/bulk.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ID_BYTES", "MAX_ENTRIES", "TTL_S", "Entry", "Filling", "Outbox"]

ID_BYTES = 16
TTL_S = 120.0  # an unfetched transfer is let go after this: its reader is gone (a fault, a stale step)
MAX_ENTRIES = 4096  # transfers parked at once; beyond, senders go inline over gRPC


@dataclass(eq=False)
class Entry:
    parts: Sequence[memoryview]  # the payload, in order (a complete transfer)
    total: int
    readers: int  # fetches left before it is let go
    deadline: float


@dataclass(eq=False)
class Filling:
    """A transfer still arriving (a relay's): readers are served what has arrived, and wait for the rest."""

    total: int
    readers: int
    deadline: float
    buf: np.ndarray = field(init=False)
    filled: int = 0
    error: str | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.buf = np.empty(self.total, dtype=np.uint8)

    def advance(self, n: int) -> None:
        with self.cond:
            self.filled += n
            self.cond.notify_all()

    def fail(self, why: str) -> None:
        with self.cond:
            self.error = why
            self.cond.notify_all()


class Outbox:
    """The payloads this role's streams name, waiting for their readers."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[bytes, Entry | Filling] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _park(self, entry: Entry | Filling) -> bytes | None:
        now = time.monotonic()
        with self._lock:
            if len(self._entries) >= self.max_entries:
                for key in [k for k, e in self._entries.items() if e.deadline < now]:
                    del self._entries[key]
                if len(self._entries) >= self.max_entries:
                    return None
            key = os.urandom(ID_BYTES)
            self._entries[key] = entry
            return key

    def offer(self, parts: Sequence[memoryview], readers: int = 1, ttl_s: float = TTL_S) -> bytes | None:
        """Park a complete payload for ``readers`` fetches; its id, or None where the outbox is full."""
        total = sum(len(p) for p in parts)
        return self._park(Entry(parts, total, readers, time.monotonic() + ttl_s))

    def filling(self, total: int, readers: int, ttl_s: float = TTL_S) -> tuple[bytes, Filling] | None:
        """Park an empty buffer of ``total`` bytes, to be filled while it is served; (id, it) or None."""
        entry = Filling(total, readers, time.monotonic() + ttl_s)
        key = self._park(entry)
        return None if key is None else (key, entry)

    def release(self, key: bytes) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def take(self, key: bytes) -> Entry | Filling | None:
        """The transfer ``key`` for one reader (let go once its last reader has it), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.deadline < time.monotonic():
                del self._entries[key]
                return None
            entry.readers -= 1
            if entry.readers <= 0:
                del self._entries[key]
            return entry

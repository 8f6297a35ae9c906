"""Keep freed activation buffers mapped, so the next forward does not fault them in again.

Why: a block's forward allocates ~125 MB of activations (B8, T256, C768) and backward frees them. glibc
hands large frees back to the kernel (munmap, or trimming the top of the heap), and the next allocation
of the same size gets fresh pages that the kernel zeroes on first touch, ~0.13 ms per MB here: ~7,000
page faults and 25-50 ms of CPU per block forward+backward, ~30 ms of wall time on a quiet machine.
Two mallopt settings stop that:

- M_MMAP_THRESHOLD 32 MiB (glibc's own ceiling for its moving threshold): buffers up to that size come
  from the heap, whatever order they are freed in. Larger ones (a vocabulary-sized logits array) are
  still mapped and unmapped each time.
- M_TRIM_THRESHOLD 2 GiB (the most mallopt takes): the heap is not trimmed back after a step.

Resident memory then stays at its peak between steps instead of falling back; the peak itself does not
move. Applied once, on first use, by the compute paths (``BlockUnit``), never at import: other roles
(MemoryX) import numerics and keep glibc's defaults. A setting the environment already makes
(``MALLOC_*_`` variables, as the worker's role environment does) is left alone. Not glibc: nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

__all__ = ["retain_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_SETTINGS = (
    (_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 32 << 20),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", (1 << 31) - 1),
)

_done = False
_lock = threading.Lock()


def retain_freed_memory() -> None:
    """Set the glibc malloc thresholds above for this process (once; cheap to call again)."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        _done = True
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL("libc.so.6")
            mallopt = libc.mallopt
            libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl's mallopt does nothing)
        except (OSError, AttributeError):
            return
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        for param, env, value in _SETTINGS:
            if env not in os.environ:
                mallopt(param, value)

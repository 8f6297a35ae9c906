"""The process environment of a role, the same whichever backend starts it.

Threads: the workers do the compute and share the cores they are given; every other role moves bytes and
gets one thread. Without a cap each process's BLAS would start a spinning thread per core, and a handful of
processes on a few cores would mostly fight each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["STREAMING_MALLOC_ENV", "THREAD_ENV_VARS", "role_env", "role_threads", "without_secrets"]

# Every library that may start a thread pool in a role: OpenBLAS, OpenMP, MKL (numpy built against it),
# and our own elementwise kernels (numerics/_blocked.py).
THREAD_ENV_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "WEIGHTSTREAM_NUM_THREADS")

# Roles allocate and free unit-sized buffers all the time, from several threads. glibc's defaults cost them
# page faults: fresh pages, zeroed by the kernel on first touch, for memory freed a moment before.
# - One malloc arena for every thread: glibc gives each further thread an arena of 64 MiB heaps and unmaps a
#   heap as soon as all of it is free, whatever the trim threshold says, so a worker computing on a thread
#   of its own (not the main one) got every step's activations as fresh pages: ~21,000 faults and 1.2 s of
#   system CPU per GPT-2 d768/L12 step, 0.3 s with one arena. One arena also bounds resident memory (arenas
#   each keep what was freed in them; a test checks a worker's memory against depth).
# - The top of that one heap is not trimmed back below 2 GiB free: with glibc's 128 KiB MemoryX's
#   optimizer, freeing its cache-sized temporaries, gave ~18,000 pages back a step and faulted them in
#   again. Resident memory stays at its peak; the peak does not move (numerics/_memory.py: the same
#   setting, for processes started without this environment).
# - The mmap threshold is fixed at 64 MiB, where glibc would move it after large frees: smaller buffers
#   (activations, messages) are reused from the heap, and larger ones go back to the system when freed. A
#   1 MiB threshold made every activation a fresh zeroed mapping and a GPT-2 step 40% slower.
STREAMING_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(64 << 20),
    "MALLOC_TRIM_THRESHOLD_": str((1 << 31) - 1),
    "MALLOC_ARENA_MAX": "1",
}


def role_threads(kind: str, worker_cores: int) -> int:
    """Threads for a role of ``kind``: a worker uses the ``worker_cores`` it is given, others one."""
    return max(1, worker_cores) if kind == "worker" else 1


def role_env(kind: str, worker_cores: int) -> dict[str, str]:
    """Environment variables (added to the inherited ones) for a role process of ``kind``."""
    threads = str(role_threads(kind, worker_cores))
    return {**{n: threads for n in THREAD_ENV_VARS}, **STREAMING_MALLOC_ENV}


# Variables a role must not inherit from the process that starts it: the service's API token first, and
# whatever else names a secret by convention (cloud keys, passwords) that an operator may have exported.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY", re.IGNORECASE)


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less every variable whose name says it holds a secret (``WEIGHTSTREAM_TOKEN``, ...)."""
    return {k: v for k, v in environ.items() if not _SECRET_NAME.search(k)}

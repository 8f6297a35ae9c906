"""The sparse weight kernels (numerics/sparse.py) across processes: bitwise the same across reruns and
thread counts (each in a process of its own), and importable without a writable numba cache. The rest is
in tests/unit/numerics/test_sparse_kernels.py."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.model_checks import digest_with_threads
from tests.sparse_weights import kernels_digest


def test_bitwise_the_same_across_reruns_and_thread_counts() -> None:
    assert kernels_digest() == kernels_digest()
    digests = {n: digest_with_threads("tests.sparse_weights:kernels_digest", n) for n in (1, 2)}
    assert digests[1] == digests[2] == kernels_digest()


def test_import_works_without_a_writable_numba_cache() -> None:
    """No cache locator usable (a read-only install, no NUMBA_CACHE_DIR): compile in memory, still run."""
    child = (
        "import numpy as np; from weightstream.numerics.sparse import SparseWeight, sparse_matmul; "
        "w = SparseWeight.from_positions((4, 3), np.array([1, 5], np.int64), np.ones(2, np.float32)); "
        "print(sparse_matmul(np.ones((2, 4), np.float32), w).sum())"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}  # finds no place to cache
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4.0"

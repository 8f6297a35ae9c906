"""Run a chain of elementwise/row-wise numpy ops over cache-sized row blocks, on every core.

Why: numpy runs each ufunc as one single-threaded pass over the whole array, so a chain of k ops over an
activation of tens of MB makes k trips to DRAM on one core while BLAS uses all of them. Cutting the rows
into blocks of ~256 KiB keeps the whole chain in L2, and numpy releases the GIL inside ufuncs, so the
blocks run in parallel threads. Blocks are whole rows: a reduction along a row never spans two blocks,
so results are bitwise identical whatever the block size or thread count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["THREADS", "for_row_blocks"]

THREADS = max(1, min(int(os.environ.get("WEIGHTSTREAM_NUM_THREADS", os.cpu_count() or 1)), 16))
_BLOCK_ELEMS = 1 << 16  # 64 Ki elements = 256 KiB of float32 per operand
_MIN_PARALLEL_ELEMS = 1 << 18  # below this, thread hand-off costs more than it saves

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS - 1, thread_name_prefix="ws-rows")
        return _pool


def for_row_blocks(fn: Callable[[slice], None], rows: int, row_len: int) -> None:
    """Call ``fn(rows_slice)`` for consecutive blocks of whole rows covering ``range(rows)``.

    ``fn`` must only touch its own rows of its outputs. Blocks are spread over ``THREADS`` threads
    (the calling thread takes a share), each thread taking a contiguous run of blocks.
    """
    block = max(1, _BLOCK_ELEMS // max(row_len, 1))
    blocks = [slice(i, min(i + block, rows)) for i in range(0, rows, block)]
    if THREADS == 1 or len(blocks) == 1 or rows * row_len < _MIN_PARALLEL_ELEMS:
        for s in blocks:
            fn(s)
        return
    per = -(-len(blocks) // THREADS)
    runs = [blocks[i : i + per] for i in range(0, len(blocks), per)]

    def run_all(run: list[slice]) -> None:
        for s in run:
            fn(s)

    futures = [_get_pool().submit(run_all, r) for r in runs[1:]]
    run_all(runs[0])
    for f in futures:
        f.result()

"""All of the worker's parallelism: our threads, each running numpy ufuncs and single-threaded BLAS.

Why blocks: numpy runs each ufunc as one single-threaded pass over the whole array, so a chain of k ops
over an activation of tens of MB makes k trips to DRAM on one core. Cutting the rows into blocks of
~512 KiB keeps the whole chain in L2, and numpy releases the GIL inside ufuncs and BLAS calls, so the
blocks run in parallel threads.

Why our threads for the products too (``matmul``: one part per thread, BLAS on one thread): BLAS's own
two threads are at best 3% faster on the block's products alone, but after every call its idle thread
spins for ~0.1 s waiting for more work, on the core our threads need for the elementwise work in between
(measured: the attention forward ran 2x slower right after a two-thread product, and the whole block 20%
slower). Inside ``single_threaded_blas`` BLAS never wakes its pool, so the pool sleeps.

Determinism: blocks are whole rows, a reduction along a row never spans two blocks, and every partition
(row blocks, product parts, column halves) is a function of the shapes only, never of the thread count.
So results are bitwise identical whatever the thread count, and whichever thread computes a task.

Why tasks are taken, not dealt: each thread takes the next task not yet taken, rather than a fixed run of
them. On a small machine the worker's transport threads and the other roles preempt a compute thread now
and then; with fixed runs the other thread then waits at the end for the preempted one's share, with
taken tasks it takes that share over (measured on 2 cores: the appliance step at d512/L4 1.60 -> 1.55 s,
the in-process reference unchanged).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial

import numpy as np
from threadpoolctl import ThreadpoolController

from weightstream.numerics._gemm import gemm

__all__ = [
    "THREADS",
    "for_row_blocks",
    "matmul",
    "product_parts",
    "rows2",
    "run_tasks",
    "single_threaded_blas",
    "sum_rows",
]

THREADS = max(1, min(int(os.environ.get("WEIGHTSTREAM_NUM_THREADS", os.cpu_count() or 1)), 16))
_BLOCK_ELEMS = 1 << 17  # 128 Ki elements = 512 KiB of float32 per operand (measured best; 256 KiB: +10%)
_MIN_PARALLEL_ELEMS = 1 << 18  # below this, thread hand-off costs more than it saves
# Parts of one matrix product, along its longer output side. Fixed (not THREADS) so that the partition,
# hence every bit of the result, never depends on the thread count. Four parts cost ~4% more than two
# on the Xeon, 1.4% on the AMD EPYC (each part packs the shared operand again), and did not pay there even
# with the other roles preempting our threads, which more parts would let the other thread cover: raise it
# only on machines with more cores.
_GEMM_PARTS = 2
_MIN_GEMM_PART = 128  # rows or columns; below that the product is too small to split

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_blas: ThreadpoolController | None = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS - 1, thread_name_prefix="ws-rows")
        return _pool


_in_task = threading.local()


def run_tasks(tasks: list[Callable[[], None]]) -> None:
    """Run ``tasks`` (independent, writing disjoint outputs) on ``THREADS`` threads, each thread taking
    the next task not yet taken; the calling thread takes part. Called from inside a task, it runs them
    in order on the calling thread (the cores are taken already)."""
    if THREADS == 1 or len(tasks) <= 1 or getattr(_in_task, "on", False):
        for task in tasks:
            task()
        return
    taken = itertools.count()  # next() on a count is atomic under the GIL

    def run_all() -> None:
        _in_task.on = True
        try:
            while (i := next(taken)) < len(tasks):
                tasks[i]()
        finally:
            _in_task.on = False

    futures = [_get_pool().submit(run_all) for _ in range(min(THREADS, len(tasks)) - 1)]
    run_all()
    for f in futures:
        f.result()


def rows2(a: np.ndarray) -> np.ndarray:
    """``a`` [..., C] as rows [N, C] (a view when ``a`` is contiguous): what the row-block passes walk."""
    return a.reshape(-1, a.shape[-1])


def for_row_blocks(fn: Callable[[slice], None], rows: int, row_len: int) -> None:
    """Call ``fn(rows_slice)`` for consecutive blocks of whole rows covering ``range(rows)``.

    ``fn`` must only touch its own rows of its outputs. Blocks are spread over ``THREADS`` threads
    (the calling thread takes a share), each taking the next block not yet taken (``run_tasks``).
    """
    block = max(1, _BLOCK_ELEMS // max(row_len, 1))
    blocks = [slice(i, min(i + block, rows)) for i in range(0, rows, block)]
    if rows * row_len < _MIN_PARALLEL_ELEMS:
        for s in blocks:
            fn(s)
        return
    run_tasks([partial(fn, s) for s in blocks])


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS on one thread inside, so that our threads (``matmul``, ``for_row_blocks``) own the cores.

    Always one thread, whatever ``THREADS`` is, so the same BLAS code computes every product. The
    setting is process-wide while it lasts (the worker computes on one thread; others only move bytes);
    nested uses cost nothing.
    """
    global _blas
    with _pool_lock:
        if _blas is None:
            _blas = ThreadpoolController().select(user_api="blas")
    if all(info["num_threads"] == 1 for info in _blas.info()):
        yield
        return
    with _blas.limit(limits=1):
        yield


def _spans(size: int, parts: int) -> list[slice]:
    step = -(-size // max(1, parts))
    return [slice(i, min(i + step, size)) for i in range(0, size, step)]


def product_parts(size: int) -> list[slice]:
    """The fixed split of a product's longer side, or of a row sum's columns: up to ``_GEMM_PARTS`` parts
    of at least ``_MIN_GEMM_PART`` (one part below that), a function of ``size`` only."""
    return _spans(size, min(_GEMM_PARTS, size // _MIN_GEMM_PART))


def matmul(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, bias: np.ndarray | None = None
) -> np.ndarray:
    """a [M, K] @ b [K, N] (+ bias) -> out [M, N], in ``_GEMM_PARTS`` parts along the longer of M and N,
    one single-threaded BLAS call per part on our threads. ``a`` and ``b`` may be transposed views.

    ``bias`` is [N] (one per column) or [M, 1] (one per row); each part adds its share right after its
    product, so the add is not a separate dispatch."""
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(a, b))
    along_rows = m >= n
    size = m if along_rows else n
    row_bias = bias is not None and bias.ndim == 2

    def part(s: slice) -> None:
        if along_rows:
            o = out[s]
            gemm(a[s], b, o)
            if bias is not None:
                o += bias[s] if row_bias else bias
        else:
            o = out[:, s]
            gemm(a, b[:, s], o)
            if bias is not None:
                o += bias if row_bias else bias[s]

    with single_threaded_blas():
        run_tasks([partial(part, s) for s in product_parts(size)])
    return out


def sum_rows(a: np.ndarray) -> np.ndarray:
    """a [M, N] -> [N], the sum over rows (a bias gradient), in ``_GEMM_PARTS`` column parts: a split
    fixed by the shape, like ``matmul``'s."""
    out = np.empty(a.shape[1], dtype=a.dtype)

    def part(s: slice) -> None:
        np.add.reduce(a[:, s], axis=0, out=out[s])

    run_tasks([partial(part, s) for s in product_parts(a.shape[1])])
    return out

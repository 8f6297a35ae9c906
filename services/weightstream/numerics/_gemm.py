"""The engine of the workers' matrix products: Intel MKL's sgemm on numpy's arrays, or numpy's own BLAS.

Why MKL: about 80% of a GPT-2 block's time is its twelve products, and on the Xeon (AVX-512) these
benchmarks run on, MKL's single-threaded sgemm is ~9% faster than the OpenBLAS numpy ships (the block's
products: 109 against 118-120 ms, two threads each computing one half, measured side by side). PyTorch
computes its products with MKL too, so with OpenBLAS the kernels could not match it whatever the rest of
the block cost (``bench/kernels.py`` prints both engines' peaks). numpy stays the compute engine: the
arrays, the elementwise work and the attention's small stacked products are numpy's; only the call that
fills ``out`` with ``a @ b`` goes to MKL, through ctypes, on the same buffers (no copy either way).

Which engine: MKL where the ``mkl`` wheel is installed (a core dependency on Linux x86-64, the platform
it is built for) and the CPU is Intel's; numpy's BLAS elsewhere. MKL dispatches its fastest code paths on
Intel CPUs only: on an AMD EPYC (Zen 4, AVX-512) its sequential sgemm reached 126-200 GFLOP/s on the
block's shapes where the OpenBLAS numpy ships reached 198-207, and a GPT-2 block took 0.57-0.76 s on
MKL against 0.50-0.53 s on OpenBLAS (three runs of ``bench/kernels.py`` each, interleaved).
``WEIGHTSTREAM_GEMM=numpy`` forces numpy's (to compare, or where MKL misbehaves); ``WEIGHTSTREAM_GEMM=mkl``
forces MKL on any CPU, and makes a missing MKL an error instead of a fallback. The choice is made once per
process from the environment and the CPU's vendor, never from timings, and ``engine()`` names it: the
roles log it at start, so a run's speed never changes without saying why.

Determinism: MKL runs sequential (our threads split the products, see ``_blocked``) and in Conditional
Numerical Reproducibility mode AUTO, so a product's bits do not depend on its operands' alignment (which
follows malloc from run to run) and reruns are bitwise equal. MKL and OpenBLAS round differently, so
all processes of a job must use the same engine: they inherit one environment, and run on one kind of
CPU (a cluster mixing Intel and AMD nodes would need ``WEIGHTSTREAM_GEMM`` set for every role).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import threading
from collections.abc import Callable

import numpy as np

from weightstream.blas_kernel import numpys_blas

__all__ = ["bmm", "cpu_vendor", "engine", "gemm"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS_LAYOUT / CBLAS_TRANSPOSE
_THREADING_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL (mkl_service.h)
_CBWR_AUTO = 2  # MKL_CBWR_AUTO (mkl_types.h): reproducible on this CPU, whatever the alignment
_INT_MAX = 2**31 - 1  # MKL's LP64 interface: 32-bit sizes and strides
_F32 = np.dtype(np.float32)
_INTEL = "GenuineIntel"

# an MKL function through ctypes: its argtypes convert and check the arguments, its restype is None
_CBlas = Callable[..., None]

_lock = threading.Lock()
# (engine name, cblas_sgemm or None, cblas_sgemm_batch_strided or None)
_loaded: tuple[str, _CBlas | None, _CBlas | None] | None = None


class GemmEngineError(RuntimeError):
    pass


def _mkl_library() -> str | None:
    """The path of ``libmkl_rt`` from the installed ``mkl`` wheel, or None without one."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libmkl_rt.so"):
            return str(f.locate())
    return None


def _load_mkl(path: str) -> tuple[str, _CBlas, _CBlas]:
    lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    # Both settings must come before MKL computes anything in this process.
    lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
    lib.MKL_Set_Threading_Layer(_THREADING_SEQUENTIAL)
    lib.MKL_CBWR_Set.argtypes = [ctypes.c_int]
    if lib.MKL_CBWR_Set(_CBWR_AUTO) != 0:
        raise GemmEngineError(f"MKL ({path}) refused numerical reproducibility mode AUTO")
    version = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(version, len(version))
    sgemm = lib.cblas_sgemm
    sgemm.restype = None
    i, p = ctypes.c_int, ctypes.c_void_p
    # layout, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
    sgemm.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, p, i, ctypes.c_float, p, i]
    batch = lib.cblas_sgemm_batch_strided
    batch.restype = None
    # layout, transa, transb, m, n, k, alpha, a, lda, stridea, b, ldb, strideb, beta, c, ldc, stridec, count
    batch.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, i, p, i, i, ctypes.c_float, p, i, i, i]
    name = version.value.decode(errors="replace").split(" for ")[0].replace("Intel(R) oneAPI ", "")
    return f"mkl ({name})", sgemm, batch


def _numpy_blas() -> str:
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # a report, never a reason to fail
        infos = []
    info = numpys_blas(infos)
    if info is None:
        return "numpy"
    # e.g. "numpy (openblas 0.3.31 Haswell)": the kernel set says whether blas_kernel.py's choice took
    words = [info.get("internal_api", "blas"), info.get("version", ""), info.get("architecture", "")]
    return f"numpy ({' '.join(w for w in words if w)})"


def _load() -> tuple[str, _CBlas | None, _CBlas | None]:
    global _loaded
    with _lock:
        if _loaded is None:
            want = os.environ.get("WEIGHTSTREAM_GEMM", "").strip().lower()
            if want not in ("", "mkl", "numpy"):
                raise GemmEngineError(f"WEIGHTSTREAM_GEMM must be 'mkl' or 'numpy' (got {want!r})")
            path = None if want == "numpy" else _mkl_library()
            if path is not None and want == "" and cpu_vendor() != _INTEL:
                path = None  # MKL's fast paths are Intel's: numpy's BLAS is the faster one here
            if path is not None:
                _loaded = _load_mkl(path)
            elif want == "mkl":
                raise GemmEngineError(
                    "WEIGHTSTREAM_GEMM=mkl but the mkl package is not installed (pip install mkl)"
                )
            else:
                _loaded = (_numpy_blas(), None, None)
        return _loaded


def cpu_vendor() -> str:
    """The CPU's vendor as the kernel reports it (``GenuineIntel``, ``AuthenticAMD``), or "" unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def engine() -> str:
    """What computes the products in this process: ``mkl (...)`` or ``numpy (openblas ...)``."""
    return _load()[0]


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension) of a float32 2-D view as MKL reads it in row-major
    order, or None when MKL cannot read it in place (numpy then computes the product)."""
    rows, cols = x.shape
    s0, s1 = x.strides
    if s1 == _F32.itemsize and s0 % _F32.itemsize == 0 and cols <= s0 // _F32.itemsize <= _INT_MAX:
        return _NO_TRANS, s0 // _F32.itemsize  # rows of a row-major matrix
    if s0 == _F32.itemsize and s1 % _F32.itemsize == 0 and rows <= s1 // _F32.itemsize <= _INT_MAX:
        return _TRANS, s1 // _F32.itemsize  # the transpose of a row-major matrix (a ``.T`` view)
    return None


def _in_place(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether MKL can compute the float32 2-D product a @ b into ``out`` as they lie (``out``'s rows
    unit-stride, sizes and leading dimension within LP64's 32 bits). Vectors go to numpy: their strides
    do not say their layout, and numpy's GEMV handles them."""
    m, k = a.shape
    n = b.shape[1]
    return (
        a.dtype == _F32
        and b.dtype == _F32
        and out.dtype == _F32
        and min(m, n, k) > 1
        and max(m, n, k) <= _INT_MAX
        and out.strides[1] == _F32.itemsize
        and n <= out.strides[0] // _F32.itemsize <= _INT_MAX
        and out.strides[0] % _F32.itemsize == 0
    )


def _shares(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """An output that may overlap an operand: MKL would overwrite what it still reads (numpy copies)."""
    return bool(np.may_share_memory(out, a) or np.may_share_memory(out, b))


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a @ b`` for 2-D ``a`` [M, K], ``b`` [K, N], ``out`` [M, N] (views allowed), on this
    process's engine. Which code computes a given product depends on its shapes and layouts only."""
    sgemm = (_loaded or _load())[1]  # no lock once loaded: both compute threads call this at once
    m, k = a.shape
    n = b.shape[1]
    flags = None
    if sgemm is not None and _in_place(a, b, out) and not _shares(out, a, b):
        fa, fb = _operand(a), _operand(b)
        if fa is not None and fb is not None:
            flags = fa, fb
    if sgemm is None or flags is None:
        np.matmul(a, b, out=out)
        return
    (ta, lda), (tb, ldb) = flags
    ldc = out.strides[0] // _F32.itemsize
    sgemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0, out.ctypes.data, ldc)


def _batch_stride(x: np.ndarray) -> int | None:
    """Elements between consecutive matrices of a 3-D view, or None where MKL cannot step by it."""
    step = x.strides[0]
    if step < 0 or step % _F32.itemsize or step // _F32.itemsize > _INT_MAX:
        return None
    return step // _F32.itemsize


def bmm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[g] = a[g] @ b[g]`` for 3-D ``a`` [G, M, K], ``b`` [G, K, N], ``out`` [G, M, N] (views of
    evenly spaced matrices allowed), in one call: MKL's strided batch, or numpy's stacked matmul.

    Why: the attention's products are small (64 x 128 x 256 per head), where numpy's stacked matmul (one
    OpenBLAS call per matrix) reached ~110 GFLOP/s on one core and MKL's batch ~140 (measured on the
    attention backward's four products: 29.7 against 23.1 ms on one thread)."""
    batch = (_loaded or _load())[2]
    flags = None
    if (
        batch is not None
        and a.ndim == b.ndim == out.ndim == 3
        and 0 < a.shape[0] <= _INT_MAX
        and _in_place(a[0], b[0], out[0])
        and not _shares(out, a, b)
    ):
        fa, fb = _operand(a[0]), _operand(b[0])
        sa, sb, so = _batch_stride(a), _batch_stride(b), _batch_stride(out)
        footprint = (out.shape[1] - 1) * (out.strides[1] // _F32.itemsize) + out.shape[2]
        disjoint = so is not None and so >= footprint  # the output matrices must not overlap
        if fa is not None and fb is not None and sa is not None and sb is not None and disjoint:
            flags = fa, fb, sa, sb, so
    if batch is None or flags is None:
        np.matmul(a, b, out=out)
        return
    (ta, lda), (tb, ldb), sa, sb, so = flags
    g, m, k = a.shape
    n = b.shape[2]
    ldc = out.strides[1] // _F32.itemsize
    batch(
        _ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, sa, b.ctypes.data, ldb, sb,
        0.0, out.ctypes.data, ldc, so, g,
    )  # fmt: skip

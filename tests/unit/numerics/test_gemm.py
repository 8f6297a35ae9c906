"""The workers' matrix-product engine (numerics/_gemm.py): MKL where installed on an Intel CPU, numpy's BLAS
otherwise; each test that computes runs on both where MKL is installed.
Across processes: tests/integration/test_gemm.py."""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import Any

import numpy as np
import pytest

from weightstream.numerics import _gemm
from weightstream.numerics._blocked import matmul, single_threaded_blas
from weightstream.numerics._gemm import engine, gemm

ON_MKL_PLATFORM = sys.platform == "linux" and platform.machine() == "x86_64"


HAS_MKL = _gemm._mkl_library() is not None


def _choose(monkeypatch: pytest.MonkeyPatch, setting: str, vendor: str | None = None) -> str:
    """The engine a fresh process would choose with ``WEIGHTSTREAM_GEMM=setting`` on a CPU of ``vendor``
    (this machine's when None); it stays this test's engine (monkeypatch restores the process's after)."""
    monkeypatch.setattr(_gemm, "_loaded", None)
    monkeypatch.setenv("WEIGHTSTREAM_GEMM", setting)
    if vendor is not None:
        monkeypatch.setattr(_gemm, "cpu_vendor", lambda: vendor)
    return engine()


@pytest.fixture(params=["mkl", "numpy"])
def each_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test on MKL and on numpy's BLAS, whichever this CPU would choose by itself."""
    if request.param == "mkl" and not HAS_MKL:
        pytest.skip("the mkl package is not installed (a dependency on Linux x86-64 only)")
    return _choose(monkeypatch, request.param).split()[0]


@pytest.mark.skipif(not ON_MKL_PLATFORM, reason="the mkl dependency is for Linux x86-64 only")
def test_the_engine_follows_the_cpu_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyproject makes mkl a core dependency here: on an Intel CPU it must compute the products (installed
    but not found, the workers would silently fall back to the slower BLAS); on any other vendor numpy's
    BLAS does (MKL's fast paths are Intel's), unless WEIGHTSTREAM_GEMM=mkl forces MKL."""
    assert HAS_MKL
    assert _choose(monkeypatch, "", "GenuineIntel").startswith("mkl (Math Kernel Library")
    assert _gemm._load()[1] is not None
    assert _choose(monkeypatch, "", "AuthenticAMD").startswith("numpy")
    assert _gemm._load()[1] is None
    assert _choose(monkeypatch, "", "").startswith("numpy")  # an unknown vendor: the safe default
    assert _choose(monkeypatch, "mkl", "AuthenticAMD").startswith("mkl (Math Kernel Library")
    assert _choose(monkeypatch, "numpy", "GenuineIntel").startswith("numpy")


def test_this_machine_reports_its_vendor() -> None:
    """The vendor comes from /proc/cpuinfo where there is one (what the choice above reads)."""
    if not os.path.exists("/proc/cpuinfo"):
        assert _gemm.cpu_vendor() == ""
        return
    with open("/proc/cpuinfo") as f:
        line = next((x for x in f if x.startswith("vendor_id")), "vendor_id: ")
    assert _gemm.cpu_vendor() == line.split(":", 1)[1].strip()
    if ON_MKL_PLATFORM and not os.environ.get("WEIGHTSTREAM_GEMM"):
        assert engine().startswith("mkl") == (_gemm.cpu_vendor() == "GenuineIntel")


def _views(rng: np.random.Generator, m: int, k: int, n: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Operands in every layout the workers pass: plain, transposed views, slices with a leading
    dimension larger than the width, and starts off any alignment."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    wide_a = rng.standard_normal((m + 3, k + 5), dtype=np.float32)
    wide_a[1 : m + 1, 2 : k + 2] = a
    return [
        ("NN", a, b),
        ("TN", np.ascontiguousarray(a.T).T, b),
        ("NT", a, np.ascontiguousarray(b.T).T),
        ("TT", np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T),
        ("slices", wide_a[1 : m + 1, 2 : k + 2], b),
        ("columns", a, np.ascontiguousarray(np.concatenate([b, b], axis=1))[:, n // 2 : n // 2 + n]),
    ]


@pytest.mark.parametrize("shape", [(64, 48, 80), (257, 131, 67), (2, 3, 2)])
def test_every_layout_computes_the_product(shape: tuple[int, int, int], each_engine: str) -> None:
    rng = np.random.default_rng(0)
    m, k, n = shape
    for name, a, b in _views(rng, m, k, n):
        want = a.astype(np.float64) @ b.astype(np.float64)
        out = np.full((m, n), np.nan, dtype=np.float32)
        gemm(a, b, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=name)
        # into a column slice of a wider output (``_blocked.matmul``'s column parts)
        wide = np.full((m, n + 7), np.nan, dtype=np.float32)
        gemm(a, b, wide[:, 3 : n + 3])
        np.testing.assert_allclose(wide[:, 3 : n + 3], want, rtol=1e-4, atol=1e-4, err_msg=name)
        assert np.isnan(wide[:, :3]).all() and np.isnan(wide[:, n + 3 :]).all(), "wrote outside its columns"


def test_what_mkl_cannot_read_in_place_goes_to_numpy() -> None:
    """Vectors, float64 and an output overlapping an input: numpy computes them, correctly."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 4), dtype=np.float32)
    pairs: list[tuple[np.ndarray, np.ndarray]] = [
        (a[:1], a.T),
        (a, a.T[:, :1]),
        (a.astype(np.float64), a.T.astype(np.float64)),
    ]
    for x, y in pairs:
        out = np.empty((x.shape[0], y.shape[1]), dtype=x.dtype)
        gemm(x, y, out)
        np.testing.assert_allclose(out, x @ y, rtol=1e-5)
    sq = rng.standard_normal((600, 600), dtype=np.float32)  # larger than MKL packs in one piece
    want = sq @ sq
    gemm(sq, sq.copy(), sq)  # out is the first operand
    np.testing.assert_allclose(sq, want, rtol=1e-4, atol=1e-3)


def test_same_alignment_gives_same_bits_in_process(each_engine: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 200), dtype=np.float32)
    b = rng.standard_normal((200, 150), dtype=np.float32)
    digests = set()
    for off in range(16):
        buf = np.empty(a.size + 16, np.float32)[off : off + a.size].reshape(a.shape)
        buf[...] = a
        digests.add(hashlib.sha256(matmul(buf, b).tobytes()).hexdigest())
    assert len(digests) == 1


def test_a_bad_engine_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gemm, "_loaded", None)
    monkeypatch.setenv("WEIGHTSTREAM_GEMM", "cublas")
    with pytest.raises(_gemm.GemmEngineError, match="WEIGHTSTREAM_GEMM must be 'mkl' or 'numpy'"):
        engine()
    monkeypatch.setenv("WEIGHTSTREAM_GEMM", "mkl")
    monkeypatch.setattr(_gemm, "_mkl_library", lambda: None)
    with pytest.raises(_gemm.GemmEngineError, match="mkl package is not installed"):
        engine()
    monkeypatch.setenv("WEIGHTSTREAM_GEMM", "")
    assert engine().startswith("numpy")  # no mkl: numpy's BLAS, named
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(matmul(a, a.T), a @ a.T)


def test_the_workers_products_run_on_the_engine(each_engine: str) -> None:
    """``_blocked.matmul`` (every product of the workers' units) computes each of its parts with
    ``gemm``: bitwise what the engine gives for the same part, whichever engine that is."""
    rng = np.random.default_rng(3)
    # K = 1000: long enough that MKL and OpenBLAS sum in different orders (up to 768 they agree here)
    a = rng.standard_normal((512, 1000), dtype=np.float32)
    b = rng.standard_normal((1000, 200), dtype=np.float32)
    want = np.empty((512, 200), dtype=np.float32)
    with single_threaded_blas():  # as matmul calls it (OpenBLAS's bits depend on its thread count)
        gemm(a[:256], b, want[:256])  # the two row parts _blocked.matmul makes of this shape
        gemm(a[256:], b, want[256:])
    np.testing.assert_array_equal(matmul(a, b), want)
    if each_engine == "mkl":  # and MKL's bits are not numpy's here: the test can tell them apart
        assert not np.array_equal(want, np.matmul(a, b))


def _batch_views(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """The attention's operands (attention.py): heads as [G, D, T] views of a feature-major [3C, N]
    array (matrices D * N apart), their transposes, and blocks of a [G, T, T] score buffer; each output a
    window of its own NaN-filled buffer."""
    g, d, t, n_cols = 3, 16, 40, 100
    qkv = rng.standard_normal((3 * g * d, n_cols), dtype=np.float32)
    heads = [qkv[i * g * d : (i + 1) * g * d, 20 : 20 + t].reshape(g, d, t) for i in range(3)]  # q, k, v
    scores = rng.standard_normal((g, t, t), dtype=np.float32)

    def y() -> np.ndarray:  # [G, D, T] heads of a fresh feature-major output
        return np.full((g * d, n_cols), np.nan, dtype=np.float32)[:, 20 : 20 + t].reshape(g, d, t)

    return [
        ("k^T q", heads[1][:, :, :30].transpose(0, 2, 1), heads[0][:, :, 10:25],
         np.full((g, t, t), np.nan, dtype=np.float32)[:, :30, 10:25]),
        ("v p", heads[2][:, :, :30], scores[:, :30, 10:25], y()[:, :, 10:25]),
        ("q g^T", heads[0][:, :, 10:], scores[:, 5:20, 10:].transpose(0, 2, 1), y()[:, :, 5:20]),
        ("one matrix", heads[1][:1], scores[:1, :, :7], y()[:1, :, :7]),
        ("one matrix, broadcast", np.broadcast_to(scores[0, :16, :30], (1, 16, 30)), scores[:1, :30, :7],
         y()[:1, :, :7]),
        ("shared left operand", np.broadcast_to(scores[0, :16, :30], (3, 16, 30)), scores[:, :30, :7],
         y()[:, :, :7]),
    ]  # fmt: skip


def test_batched_products_in_the_attentions_layouts(each_engine: str) -> None:
    rng = np.random.default_rng(4)
    for name, a, b, out in _batch_views(rng):
        base = out
        while base.base is not None:
            base = base.base
        _gemm.bmm(a, b, out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
        outside = np.ones(base.size, dtype=bool)
        outside[_offsets(out, base)] = False
        assert np.isnan(base.reshape(-1)[outside]).all(), f"{name}: wrote outside its window"


def _offsets(view: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Flat indices into ``base`` of every element of ``view``."""
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // view.itemsize
    idx = np.full(view.shape, start, dtype=np.int64)
    for axis, stride in enumerate(view.strides):
        shape = [1] * view.ndim
        shape[axis] = view.shape[axis]
        idx = idx + (np.arange(view.shape[axis]) * (stride // view.itemsize)).reshape(shape)
    return idx.reshape(-1)


def test_batched_products_mkl_cannot_take_go_to_numpy() -> None:
    """float64, and an output whose matrices overlap (batch stride smaller than one matrix): numpy."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 3, 5))
    out = np.empty((2, 4, 5))
    _gemm.bmm(a, b, out)
    np.testing.assert_array_equal(out, np.matmul(a, b))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    flat = np.zeros(40, dtype=np.float32)
    overlapping = np.lib.stride_tricks.as_strided(flat, shape=(2, 4, 5), strides=(4 * 4, 5 * 4, 4))
    calls: list[int] = []
    real = np.matmul

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*args, **kw)

    try:
        np.matmul = counted  # type: ignore[assignment]  # a counting wrapper, for this test only
        _gemm.bmm(a32, b32, overlapping)
    finally:
        np.matmul = real
    assert calls == [1]
    square = rng.standard_normal((2, 600, 600)).astype(np.float32)  # out is an operand (more than MKL packs)
    for name, x, y, into in [
        ("out is b", square[::-1].copy(), None, "b"),
        ("out is a", None, square[::-1].copy(), "a"),
    ]:
        a_op = square.copy() if x is None else x
        b_op = square.copy() if y is None else y
        want = a_op.astype(np.float64) @ b_op.astype(np.float64)
        _gemm.bmm(a_op, b_op, b_op if into == "b" else a_op)
        np.testing.assert_allclose(b_op if into == "b" else a_op, want, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.skipif(not HAS_MKL, reason="the mkl package is not installed (Linux x86-64 only)")
def test_batched_products_run_on_mkl(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _choose(monkeypatch, "mkl").startswith("mkl")
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 64, 1000), dtype=np.float32)  # K = 1000: MKL and OpenBLAS round apart
    b = rng.standard_normal((2, 1000, 48), dtype=np.float32)
    out = np.empty((2, 64, 48), dtype=np.float32)
    _gemm.bmm(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)
    assert not np.array_equal(out, np.matmul(a, b))


def test_numpys_engine_is_reported_as_numpys_own_blas_whatever_order_the_libraries_are_listed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scipy's wheels bring an OpenBLAS of their own (another version), and threadpoolctl lists the two in
    no fixed order (one process in six here put scipy's first): the benches' ``gemm_engine`` named
    0.3.30 in one run and 0.3.31 in the next, the same code. The report names numpy's own library."""
    import threadpoolctl

    site = "/site-packages"
    scipys = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.30", "architecture": "Zen",
              "filepath": f"{site}/scipy.libs/libscipy_openblas-1.so"}  # fmt: skip
    numpys = {**scipys, "version": "0.3.31", "architecture": "Haswell",
              "filepath": f"{site}/numpy.libs/libscipy_openblas64_-2.so"}  # fmt: skip
    for listed in ([scipys, numpys], [numpys, scipys]):
        monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda listed=listed: listed)
        assert _gemm._numpy_blas() == "numpy (openblas 0.3.31 Haswell)"
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [scipys])  # numpy's BLAS elsewhere
    assert _gemm._numpy_blas() == "numpy (openblas 0.3.30 Zen)"

"""Which OpenBLAS kernels numpy loads (weightstream/blas_kernel.py): AVX2 on a Zen 4, chosen before numpy
loads, the same in every process of a job (that across processes is in
tests/integration/test_blas_kernel.py)."""

from __future__ import annotations

import os
import sys

import pytest

from weightstream.blas_kernel import CORETYPE_ENV, choose_openblas_kernel, preferred_coretype


def _cpuinfo(vendor: str, family: int, flags: str) -> str:
    block = (
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: {flags}\n"
    )
    second = block.replace("processor\t: 0", "processor\t: 1").replace(vendor, "OtherVendor")
    return block + "\n" + second  # only the first processor's block is read


ZEN4 = _cpuinfo("AuthenticAMD", 25, "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl")
ZEN3 = _cpuinfo("AuthenticAMD", 25, "fpu sse2 avx avx2 fma")
ZEN5 = _cpuinfo("AuthenticAMD", 26, "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl")
XEON = _cpuinfo("GenuineIntel", 6, "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl")


@pytest.mark.parametrize(
    ("cpuinfo", "want"),
    [(ZEN4, "Haswell"), (ZEN3, None), (ZEN5, None), (XEON, None), ("", None), ("cpu family\t: x\n", None)],
)
def test_only_a_zen4_is_given_other_kernels(cpuinfo: str, want: str | None) -> None:
    """Zen 3 has no AVX-512 (OpenBLAS already picks AVX2), Zen 5 and Intel run AVX-512 full width."""
    assert preferred_coretype(cpuinfo) == want


def test_the_choice_is_made_before_numpy_and_left_in_the_environment() -> None:
    environ: dict[str, str] = {}
    assert choose_openblas_kernel(environ, modules={}, cpuinfo=ZEN4) == "Haswell"
    assert environ == {CORETYPE_ENV: "Haswell"}  # inherited by the roles this process starts
    environ = {}
    assert choose_openblas_kernel(environ, modules={}, cpuinfo=XEON) is None
    assert environ == {}  # elsewhere OpenBLAS chooses, in every process alike


def test_the_users_setting_wins() -> None:
    environ = {CORETYPE_ENV: "SkylakeX"}
    assert choose_openblas_kernel(environ, modules={}, cpuinfo=ZEN4) == "SkylakeX"
    assert environ == {CORETYPE_ENV: "SkylakeX"}


def test_too_late_a_process_passes_on_the_kernels_it_has() -> None:
    """numpy is loaded in this process: the roles it starts are told to compute with its kernels."""
    from threadpoolctl import threadpool_info

    loaded = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    own = [
        i["architecture"] for i in loaded if os.path.basename(os.path.dirname(i["filepath"])) == "numpy.libs"
    ]
    if not own:
        pytest.skip("numpy here is not built on an OpenBLAS of its own wheel")
    environ: dict[str, str] = {}
    got = choose_openblas_kernel(environ, modules=sys.modules, cpuinfo=ZEN4)
    assert got == own[0] and environ == {CORETYPE_ENV: own[0]}


def test_too_late_the_kernels_passed_on_are_numpys_whatever_order_the_libraries_are_listed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scipy's wheels load an OpenBLAS of their own, and threadpoolctl lists the two in no fixed order:
    the roles must be told numpy's kernels, which compute their products, not scipy's."""
    import threadpoolctl

    scipys = {"internal_api": "openblas", "architecture": "Zen", "filepath": "/sp/scipy.libs/libopenblas.so"}
    numpys = {**scipys, "architecture": "Haswell", "filepath": "/sp/numpy.libs/libscipy_openblas64_.so"}
    for listed in ([scipys, numpys], [numpys, scipys]):
        monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda listed=listed: listed)
        environ: dict[str, str] = {}
        assert choose_openblas_kernel(environ, modules={"numpy": object()}, cpuinfo=ZEN4) == "Haswell"
        assert environ == {CORETYPE_ENV: "Haswell"}

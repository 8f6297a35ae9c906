"""Which OpenBLAS kernels numpy loads (weightstream/blas_kernel.py): AVX2 on a Zen 4, chosen before numpy
loads, the same in every process of a job."""

from __future__ import annotations

import os
import subprocess
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


_REPORT = (
    "import sys\n{first}\n"
    "assert ('numpy' in sys.modules) == {numpy_first}\n"
    "from weightstream.numerics._gemm import engine\n"
    "import subprocess\n"
    "child = subprocess.run([sys.executable, '-c', 'import weightstream\\n"
    "from weightstream.numerics._gemm import engine\\nprint(engine())'], capture_output=True, text=True)\n"
    "print(engine()); print(child.stdout.strip())\n"
)


def _engines(first: str, numpy_first: bool) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != CORETYPE_ENV}
    script = _REPORT.format(first=first, numpy_first=numpy_first)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    parent, child = out.stdout.strip().splitlines()
    return parent, child


def _this_cpu() -> str | None:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        return preferred_coretype(f.read())


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="needs Linux's /proc/cpuinfo")
def test_a_process_and_the_roles_it_starts_compute_with_the_same_kernels() -> None:
    """``import weightstream`` imports no numpy; first, it gives this CPU's kernels to the process and its
    children; after numpy, the children get the process's kernels, whatever they are."""
    parent, child = _engines("import weightstream", numpy_first=False)
    assert parent == child
    if _this_cpu() is not None and "openblas" in parent:
        assert parent.endswith(f" {_this_cpu()})"), parent  # e.g. numpy (openblas 0.3.31 Haswell)
    late_parent, late_child = _engines("import numpy\nimport weightstream", numpy_first=True)
    assert late_parent == late_child

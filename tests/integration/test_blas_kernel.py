"""Which OpenBLAS kernels numpy loads (weightstream/blas_kernel.py), across processes: a process and the
processes it starts compute with the same kernels. The rest is in tests/unit/test_blas_kernel.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from weightstream.blas_kernel import CORETYPE_ENV, preferred_coretype

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

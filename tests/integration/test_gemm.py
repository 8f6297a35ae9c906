"""The workers' matrix-product engine (numerics/_gemm.py) across processes: products are bitwise the same
across processes, alignments and a torch in the process, and numpy can be forced. The rest is in
tests/unit/numerics/test_gemm.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from weightstream.numerics import _gemm


def _digest_script(prelude: str) -> str:
    return f"""
{prelude}
import hashlib
import numpy as np
from weightstream.numerics._blocked import matmul
from weightstream.numerics._gemm import engine
rng = np.random.default_rng(0)
h = hashlib.sha256()
a = rng.standard_normal((517, 300), dtype=np.float32)
b = rng.standard_normal((300, 333), dtype=np.float32)
for off in range(8):  # the same values from starts of every alignment
    buf = np.empty(a.size + 8, np.float32)[off : off + a.size].reshape(a.shape)
    buf[...] = a
    h.update(matmul(buf, b).tobytes())
    h.update(matmul(b.T, buf.T).tobytes())
print(engine(), h.hexdigest())
"""


def _run(script: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
        timeout=120,
    )
    return out.stdout.strip()


HAS_MKL = _gemm._mkl_library() is not None


def test_products_are_bitwise_the_same_across_processes_alignments_and_a_torch_in_the_process() -> None:
    """Reruns are bitwise equal only if a product's bits depend on its values alone: not on where malloc
    put the operands, and not on whether PyTorch (which carries its own MKL) was imported first."""
    for setting in ["mkl", "numpy"] if HAS_MKL else ["numpy"]:
        script = _digest_script("")
        first = _run(script, WEIGHTSTREAM_GEMM=setting)
        assert first.startswith(setting), first
        assert _run(script, WEIGHTSTREAM_GEMM=setting) == first
        pytest.importorskip("torch")
        assert _run(_digest_script("import torch"), WEIGHTSTREAM_GEMM=setting) == first


def test_numpy_can_be_forced_and_then_computes_exactly_as_np_matmul() -> None:
    script = """
import numpy as np
from weightstream.numerics._gemm import engine, gemm
rng = np.random.default_rng(0)
a = rng.standard_normal((100, 70), dtype=np.float32)
b = rng.standard_normal((70, 90), dtype=np.float32)
out = np.empty((100, 90), np.float32)
gemm(a, b, out)
print(engine().split()[0], bool((out == np.matmul(a, b)).all()))
"""
    assert _run(script, WEIGHTSTREAM_GEMM="numpy") == "numpy True"

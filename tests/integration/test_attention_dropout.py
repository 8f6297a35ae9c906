"""Attention dropout's kernel against the one before it, read from git history (``git show``): without a
mask it is bitwise the same. The rest is in tests/unit/numerics/test_attention_dropout.py."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from numpy.testing import assert_array_equal

from weightstream.numerics import attention as A

REPO = Path(__file__).resolve().parents[2]


BEFORE = "bfa498c"  # the last commit before attention dropout: its kernel is "today's" for rate 0


def _kernel_of(commit: str) -> ModuleType:
    """numerics/attention.py as it was at ``commit``, imported beside today's."""
    try:
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}:services/weightstream/numerics/attention.py"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history with commit {commit} (a full clone)")
    spec = importlib.util.spec_from_loader(f"attention_{commit}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(text, f"attention.py@{commit}", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("t", [10, 300])
def test_without_a_mask_the_kernel_is_bitwise_the_one_before_attention_dropout(t: int, rng) -> None:
    """In float64: the numpy passes, as they were. float32 has run numba kernels since (numerics/_fused.py,
    checked against torch and float64 in tests/unit/numerics/test_fused_kernels.py), so its bits moved on
    purpose."""
    before = _kernel_of(BEFORE)
    b, c, h = 2, 48, 6
    qkv = rng.standard_normal((b, t, 3 * c))
    dy = rng.standard_normal((b, t, c))
    y0, s0 = before.attention_forward(qkv.copy(), h)
    y1, s1 = A.attention_forward(qkv.copy(), h)
    assert_array_equal(y1, y0)
    assert_array_equal(s1.p, s0.p)
    assert_array_equal(A.attention_backward(s1, dy), before.attention_backward(s0, dy))

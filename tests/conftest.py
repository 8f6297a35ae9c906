"""Shared fixtures. Tests that need an optional tool skip with the reason, never pass silently."""

from __future__ import annotations

import contextlib
from typing import Any

import weightstream  # noqa: F401  (first: it picks numpy's OpenBLAS kernels before numpy loads them)

# isort: split
import numpy as np
import pytest

# PyTorch (the tests' reference) before anything computes a product: it exports the symbols of the MKL it
# links, and imported after the workers' sequential MKL has loaded (numerics/_gemm.py) it would bind to
# that one and run on one thread, slowing every torch reference computed afterwards.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def maps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the read-only memfd mappings (a receiver's, transport/shm.py) made while the test runs."""
    import weightstream.transport.shm as shm_module

    made: list[int] = []
    original = shm_module._map

    def counted(fd: int, size: int, *args: Any, **kw: Any) -> np.ndarray:
        if not kw["writable"]:
            made.append(size)
        return original(fd, size, *args, **kw)

    monkeypatch.setattr(shm_module, "_map", counted)
    return made

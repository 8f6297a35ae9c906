"""Shared fixtures. Tests that need an optional tool skip with the reason, never pass silently."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


@pytest.fixture
def peers_share_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every peer a role asks, when it is built, for its host (transport/peers.py) answers as a role on
    this host whose memfds map: for tests that build roles whose peers' addresses point nowhere
    (``tests.role_jobs``), on the shared-memory plane."""
    import weightstream.transport.peers as peers
    from tests.role_jobs import CREDENTIAL
    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.transport.shm import job_tag

    probe = peers.MemfdProbe(job_tag(CREDENTIAL))
    reply = pb.HealthReply(host=probe.identity, probe_pid=probe.pid, probe_fd=probe.fd)
    monkeypatch.setattr(peers, "ask_peer", lambda address, token: reply)
    yield
    probe.close()

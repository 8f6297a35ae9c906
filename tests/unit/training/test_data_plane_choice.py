"""runconfig.data_plane: which jobs may use shared memory at all (each pair of roles then chooses,
transport/peers.py); shared_memory is refused where no two roles share a host."""

from __future__ import annotations

import pytest

from weightstream.backends.kubernetes.backend import KubernetesBackend
from weightstream.backends.local import LocalProcessBackend
from weightstream.training.errors import JobFailed
from weightstream.training.roles import uses_shared_memory


def test_auto_lets_every_pair_choose_and_grpc_keeps_every_byte_on_the_network() -> None:
    assert LocalProcessBackend.co_located and not KubernetesBackend.co_located
    # auto on Kubernetes too: pods on other hosts, or in PID namespaces of their own, pick the network
    assert uses_shared_memory("auto", LocalProcessBackend) is True  # type: ignore[arg-type]
    assert uses_shared_memory("auto", KubernetesBackend) is True  # type: ignore[arg-type]
    assert uses_shared_memory("grpc", LocalProcessBackend) is False  # type: ignore[arg-type]
    assert uses_shared_memory("grpc", KubernetesBackend) is False  # type: ignore[arg-type]
    assert uses_shared_memory("shared_memory", LocalProcessBackend) is True  # type: ignore[arg-type]


def test_shared_memory_across_pods_is_refused_naming_the_key() -> None:
    with pytest.raises(JobFailed, match=r"runconfig\.data_plane: shared_memory needs every role on one host"):
        uses_shared_memory("shared_memory", KubernetesBackend)  # type: ignore[arg-type]

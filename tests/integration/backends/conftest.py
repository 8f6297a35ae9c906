"""The fake Kubernetes API server, one per test, for the Kubernetes backend's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s_fake_api import FakeKubernetesAPI


@pytest.fixture
def fake() -> Iterator[FakeKubernetesAPI]:
    api = FakeKubernetesAPI()
    yield api
    api.close()

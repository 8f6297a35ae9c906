"""Shared by the tests of memoryx/: where a shard keeps its tensors."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["memory", "disk"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """A shard's tensors in RAM (None), or in files under tmp_path (runconfig.memoryx_storage: disk): each
    test that takes it runs with both."""
    return tmp_path / "memoryx" if request.param == "disk" else None

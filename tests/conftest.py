"""Shared fixtures. Tests that need an optional tool skip with the reason, never pass silently."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

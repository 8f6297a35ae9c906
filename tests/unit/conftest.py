"""Shared by the unit tests: a small valid params file (legacy layout) for a test to change a key of."""

from __future__ import annotations

import copy
from typing import Any

import pytest

_SMALL: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 256,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "max_position_embeddings": 16,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"max_steps": 4},
}


@pytest.fixture
def small() -> dict[str, Any]:
    """A fresh copy of a small gpt2 params file that validates; change a key to break it."""
    return copy.deepcopy(_SMALL)

"""Params for tests that change a key or two: a small valid fc_mlp job, and ``edit`` to set keys of a copy
by dotted path."""

from __future__ import annotations

import copy
from typing import Any

MLP: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8},
    "model": {"name": "fc_mlp", "input_size": 16, "hidden_size": 32, "depth": 3, "num_classes": 5},
    "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1},
    "runconfig": {"max_steps": 4},
}


def edit(base: dict[str, Any], **edits: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with keys set by dotted path: edit(TINY, **{"model.hidden_size": 8})."""
    d = copy.deepcopy(base)
    for path, value in edits.items():
        *parents, last = path.split(".")
        node = d
        for key in parents:
            node = node[key]
        node[last] = value
    return d

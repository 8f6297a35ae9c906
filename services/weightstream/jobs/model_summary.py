"""What a job's params say about its model, for listings: its size and how dense its weights are."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from weightstream.params import load_params, model_def
from weightstream.params.sparsity import model_density

__all__ = ["model_summary"]


def model_summary(params: dict[str, Any]) -> tuple[int, float]:
    """(parameters, density: the share of weights that may be non-zero, 1.0 when dense). The service
    stored only params that validated; should one not load any more (an older version's), (0, 1.0)."""
    return _summary(json.dumps(params, sort_keys=True))


@lru_cache(maxsize=1024)  # listings ask for every job every few seconds; params never change
def _summary(params_json: str) -> tuple[int, float]:
    try:
        p = load_params(json.loads(params_json), source="stored params")
    except (ValueError, OSError):
        return 0, 1.0
    model = model_def(p)
    return model.num_params, model_density(p, model)

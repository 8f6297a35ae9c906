"""How much memory a worker's shard needs, and the micro-batch that makes it fit a budget.

Measured, not guessed: each unit runs once on a single zero sample with zero weights (one unit's weights
alive at a time), which gives per-sample bytes of its input and of what its backward keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from weightstream.numerics import ModelDef
from weightstream.numerics.dropout import dropout_scope
from weightstream.worker.engine import nbytes

__all__ = ["MemoryBudgetError", "MemoryProfile", "choose_micro_batch", "profile"]


class MemoryBudgetError(ValueError):
    """The budget cannot hold even the smallest micro-batch. Permanent: change the budget or the batch."""


@dataclass(frozen=True)
class MemoryProfile:
    input_bytes: int  # per sample, summed over units: the inputs kept for backward (recompute)
    max_saved_bytes: int  # per sample, the largest unit's activations kept for its backward
    max_unit_bytes: int  # the largest unit's weights

    def need(self, shard: int, micro: int) -> int:
        """Bytes of a step: every unit's input for the shard, one unit's activations for one micro-batch
        (recomputed in backward), and two units' weights (the one computing and the next, prefetched)."""
        return shard * self.input_bytes + micro * self.max_saved_bytes + 2 * self.max_unit_bytes


def profile(model: ModelDef, sample: np.ndarray) -> MemoryProfile:
    """``sample`` is one input sample with its batch axis (shape [1, ...])."""
    x = sample
    inputs = saved = unit_bytes = 0
    for unit in model.units:
        params = {n: np.zeros(model.specs[n].shape, np.float32) for n in unit.param_names}
        unit_bytes = max(unit_bytes, nbytes(tuple(params.values())))
        inputs += x.nbytes
        with dropout_scope(0, 0, 0):  # training's forward: dropout masks are kept for backward too
            x, s = unit.forward(params, x)
        saved = max(saved, nbytes(s))
    return MemoryProfile(inputs, saved, unit_bytes)


def choose_micro_batch(prof: MemoryProfile, shard: int, budget: int) -> int:
    """The largest micro-batch (a divisor of ``shard``) whose step fits ``budget`` bytes."""
    for micro in sorted((d for d in range(1, shard + 1) if shard % d == 0), reverse=True):
        if prof.need(shard, micro) <= budget:
            return micro
    mib = prof.need(shard, 1) / 2**20
    raise MemoryBudgetError(
        f"runconfig.worker_memory_mb={budget / 2**20:.0f} cannot hold a shard of {shard} samples: even "
        f"micro-batches of 1 need {mib:.1f} MiB (every unit's input, one unit's activations, two units' "
        "weights)"
    )

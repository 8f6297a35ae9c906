"""A run whose loss or gradient norm is no longer a finite number stops at that step.

Training on after a NaN or an infinity only writes checkpoints full of them and reports a "successful"
job. Both trainers check each step's loss and global gradient norm *before* the update is applied, so
the weights (and every checkpoint) stay as they were at the last finite step. MemoryX checks the
tensors themselves once more before it writes a checkpoint (``MemoryXShard.snapshot``).
"""

from __future__ import annotations

import math

from weightstream.training.errors import TrainingDiverged

__all__ = ["TrainingDiverged", "check_finite"]


def check_finite(step: int, **quantities: float) -> None:
    """Raise TrainingDiverged naming ``step`` (1-based) and each non-finite quantity (e.g. loss=…)."""
    bad = [
        f"the {name.replace('_', ' ')} is {value}"
        for name, value in quantities.items()
        if not math.isfinite(value)
    ]
    if bad:
        raise TrainingDiverged(
            f"training diverged at step {step}: {', '.join(bad)} (non-finite); no update was applied and "
            "the checkpoints written so far hold finite values. Lower the learning rate or set "
            "optimizer.max_gradient_norm."
        )

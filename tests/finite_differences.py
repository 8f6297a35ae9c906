"""Whole-model gradients against central finite differences: the check GPT-2, LLaMA and dropout share."""

from __future__ import annotations

import numpy as np
from numpy.testing import assert_allclose

from weightstream.numerics import ModelDef, forward_backward, forward_loss


def assert_grads_match_finite_differences(
    model: ModelDef,
    params: dict[str, np.ndarray],
    ids: np.ndarray,
    targets: np.ndarray,
    rng: np.random.Generator,
    atol: float,
    entries: int = 3,
    eps: float = 1e-6,
) -> None:
    """``entries`` random entries of every float64 tensor of ``params``: the analytic gradient equals
    (loss(p + eps) - loss(p - eps)) / (2 eps). Runs in the caller's context (a dropout scope applies)."""
    _, grads = forward_backward(model, params, ids, targets, targets.size)
    for name, p in params.items():
        for flat in rng.choice(p.size, size=min(entries, p.size), replace=False):
            idx = np.unravel_index(flat, p.shape)
            old = p[idx]
            p[idx] = old + eps
            up = forward_loss(model, params, ids, targets, targets.size)
            p[idx] = old - eps
            down = forward_loss(model, params, ids, targets, targets.size)
            p[idx] = old
            assert_allclose(grads[name][idx], (up - down) / (2 * eps), rtol=1e-5, atol=atol, err_msg=name)

"""Warming a role process's numba kernels before its first step needs them.

A kernel's first call in a process costs far more than the call itself: numba's own start (its compiler
and LLVM's, about 0.3 s on the 2-core development machine) and loading each kernel from the on-disk cache
(``cache=True``; a few milliseconds each). A process that takes over a lost role would pay that inside the
step it is needed for, on the job's critical path: a fault costs that much more. So a role process calls
its kind's kernels once on tiny arrays as soon as it listens, in the background (``role.serve_role``): a
standby process waiting for a role has paid it all before a fault happens, and a job's first processes
pay it while they are being configured rather than in the first step.

Each call uses the argument types of the calls the numerics make (float32, C-contiguous, the same number of
dimensions, Python ints for indices), since numba loads one compiled version per signature. The results
are thrown away; no state is touched, so training is bitwise what it would be without this.
"""

from __future__ import annotations

import numpy as np

__all__ = ["warm_layer_kernels", "warm_update_kernels"]

_F32 = np.float32


def warm_update_kernels() -> None:
    """MemoryX's kernels: the fused Adam/AdamW update (``_optim_kernels``) and the gradient's sum of squares
    (``_fused.square_sum``, the clipping norm)."""
    from weightstream.numerics._fused import square_sum
    from weightstream.numerics._optim_kernels import adam_fused

    p, g, m, v = (np.zeros(8, _F32) for _ in range(4))
    one = _F32(1.0)
    adam_fused(p, g, m, v, one, one, _F32(0.0), False, one, one, one, one, one, _F32(-0.0))
    square_sum(g)


def warm_layer_kernels() -> None:
    """A worker's kernels: both GELUs forward and the GELU backward with its bias sum (``layers``), and the
    causal softmax and its gradient (``attention``)."""
    from weightstream.numerics import _fused

    x, y, d = (np.zeros((2, 8), _F32) for _ in range(3))
    b, sums = np.zeros(8, _F32), np.zeros(8, _F32)
    _fused.gelu_tanh_rows(x, b, y, d)
    _fused.gelu_erf_rows(x, b, y, d)
    _fused.multiply_sum_columns(x, d, y, sums, 0, 8)
    p, g = np.zeros((1, 4, 4), _F32), np.zeros((1, 4, 4), _F32)
    _fused.softmax_keys(p, 0, 4)
    _fused.softmax_keys_grad(g, p, 0, 4)

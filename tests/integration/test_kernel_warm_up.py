"""The kernels a role process warms as it starts (numerics/warm.py) are the ones its steps call: after the
warm-up, the real layer, attention and optimizer paths load no other compiled version of any kernel. Run
in a fresh process, so that no other test has loaded a version first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from weightstream.numerics import _fused, _optim_kernels, attention, layers, optim
    from weightstream.numerics.warm import warm_layer_kernels, warm_update_kernels

    def loaded():
        kernels = [getattr(_fused, n) for n in _fused.__all__ if n != "exp_into"]  # exp_into: tests only
        kernels.append(_optim_kernels.adam_fused)
        return {k.__name__: list(k.signatures) for k in kernels}

    warm_update_kernels()
    warm_layer_kernels()
    warmed = loaded()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 64), dtype=np.float32)
    for exact in (False, True):
        y, d = layers.gelu_forward(x, rng.standard_normal(64, dtype=np.float32), exact=exact)
        layers.gelu_backward_sum(d, y)
    qkv = rng.standard_normal((2, 16, 96), dtype=np.float32)
    out, saved = attention.attention_forward(qkv, 4)
    attention.attention_backward(saved, out)
    cfg = optim.OptimizerConfig(kind="adamw", schedule=(), weight_decay=0.01)
    w = rng.standard_normal((64, 32), dtype=np.float32)
    g = rng.standard_normal((64, 32), dtype=np.float32)
    state = {"exp_avg": np.zeros_like(w), "exp_avg_sq": np.zeros_like(w)}
    optim.optimizer_step(cfg, w, g, state, step=1, lr=1e-3, scale=0.5)
    optim.grad_sq_sum(g)
    assert all(warmed[n] for n in warmed), warmed
    assert loaded() == warmed, (warmed, loaded())
    print("same")
    """
)


def test_after_the_warm_up_the_real_paths_load_no_other_kernel_version() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]

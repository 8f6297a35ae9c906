"""Per-unit forward+backward time of the numpy worker math, against this machine's matmul peak and PyTorch.

Prints one JSON line. Everything is measured in the same run, so the ratios mean something on a shared,
noisy machine even when the absolute numbers move. Usage:

    python bench/kernels.py [--hidden 768 --heads 12 --seq 256 --batch 8 --vocab 50257 --repeats 5]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import time
from collections.abc import Callable

import numpy as np

try:  # before weightstream computes anything: see below
    import torch
except ImportError:  # the numpy side still runs: pip install torch==2.13.0 for the comparison
    torch = None  # type: ignore[assignment]  # optional: None where torch is not installed

from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.numerics import GPT2Config, build_gpt2, init_params
from weightstream.numerics._blocked import THREADS, matmul
from weightstream.numerics._gemm import engine

# Why torch is imported first: PyTorch links its own MKL and exports its symbols, and the MKL the workers
# load (numerics/_gemm.py) runs sequential. Loaded first, that MKL's symbols would serve PyTorch's calls
# too and PyTorch would compute on one thread, an unfair peer. Loaded after, each computes as in its own
# process (the workers' products are bitwise the same with or without torch in the process).
from weightstream.numerics.layers import cross_entropy_backward, cross_entropy_forward


def best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-touch page faults, BLAS thread start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(repeats: int, workers: bool, n: int = 2048) -> float:
    """GFLOP/s of an n x n x n float32 product: as the workers compute it (``_blocked.matmul``: our
    threads, the engine of numerics/_gemm.py) or with numpy's own ``np.matmul`` (its BLAS's threads)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty_like(a)
    fn = (lambda: matmul(a, b, out=c)) if workers else (lambda: np.matmul(a, b, out=c))
    return 2 * n**3 / best_time(fn, repeats) / 1e9


def block_flops(b: int, t: int, c: int, f: int) -> float:
    """Matmul FLOPs of one block's forward; backward is twice that. Attention counts the full T x T."""
    n = b * t
    fwd = 2 * n * c * 3 * c + 2 * 2 * b * t * t * c + 2 * n * c * c + 2 * 2 * n * c * f
    return 3.0 * fwd


def head_flops(b: int, t: int, c: int, v: int) -> float:
    return 3.0 * 2 * b * t * c * v


def numpy_unit(cfg: GPT2Config, index: int, b: int, t: int) -> Callable[[], None]:
    model = build_gpt2(cfg)
    unit = model.units[index]
    params = init_params(model, seed=0, names=unit.param_names)
    rng = np.random.default_rng(1)
    x = (
        rng.integers(0, cfg.vocab_size, (b, t))
        if index == 0
        else rng.standard_normal((b, t, cfg.n_embd), dtype=np.float32)
    )
    targets = rng.integers(0, cfg.vocab_size, (b, t))

    def run() -> None:
        y, saved = unit.forward(params, x)
        if unit.name == "head":
            _, ce = cross_entropy_forward(y, targets, targets.size)
            dy = cross_entropy_backward(ce, y.shape)
        else:
            dy = np.ones_like(y, dtype=np.float32)
        unit.backward(params, saved, dy)

    return run


def torch_block(cfg: GPT2Config, b: int, t: int) -> Callable[[], None] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    c, h, f = cfg.n_embd, cfg.n_head, cfg.n_inner
    g = torch.Generator().manual_seed(0)

    def param(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).requires_grad_()

    w = {
        "attn": param(c, 3 * c),
        "attn_b": param(3 * c),
        "proj": param(c, c),
        "proj_b": param(c),
        "fc": param(c, f),
        "fc_b": param(f),
        "mproj": param(f, c),
        "mproj_b": param(c),
        "ln1": param(c),
        "ln1_b": param(c),
        "ln2": param(c),
        "ln2_b": param(c),
    }
    x = torch.randn(b, t, c, generator=g).requires_grad_()

    def run() -> None:
        y = F.layer_norm(x, (c,), w["ln1"], w["ln1_b"]) @ w["attn"] + w["attn_b"]
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in y.split(c, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x1 = x + a @ w["proj"] + w["proj_b"]
        m = F.gelu(F.layer_norm(x1, (c,), w["ln2"], w["ln2_b"]) @ w["fc"] + w["fc_b"], approximate="tanh")
        out = x1 + m @ w["mproj"] + w["mproj_b"]
        out.backward(torch.ones_like(out))

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    cfg = GPT2Config(
        vocab_size=a.vocab,
        n_positions=max(1024, a.seq),
        n_embd=a.hidden,
        n_layer=1,
        n_head=a.heads,
        n_inner=4 * a.hidden,
    )
    peak = matmul_peak(a.repeats, workers=True)
    units = {}
    unit_s: dict[str, float] = {}  # each unit's forward and backward seconds, as units has them
    for name, index, flops in (
        ("embedding", 0, 0.0),
        ("block", 1, block_flops(a.batch, a.seq, a.hidden, 4 * a.hidden)),
        ("head_and_loss", 2, head_flops(a.batch, a.seq, a.hidden, a.vocab)),
    ):
        s = best_time(numpy_unit(cfg, index, a.batch, a.seq), a.repeats)
        unit_s[name] = round(s, 5)
        units[name] = {
            "fwd_bwd_s": unit_s[name],
            "gflops": round(flops / s / 1e9, 1) if flops else None,
            "fraction_of_matmul_peak": round(flops / s / 1e9 / peak, 3) if flops else None,
        }
    result = {
        "bench": "kernels",
        "config": vars(a),
        "machine": {"numpy": np.__version__},  # beside record()'s CPU, cores, RAM and Python
        "numpy_threads": THREADS,
        "gemm_engine": engine(),  # what computes the workers' products (numerics/_gemm.py)
        "workers_matmul_peak_gflops": round(peak, 1),  # the fractions below are of this one
        "numpy_matmul_peak_gflops": round(matmul_peak(a.repeats, workers=False), 1),  # numpy's own BLAS
        "units": units,
    }
    tb = torch_block(cfg, a.batch, a.seq)
    if tb is not None and torch is not None:
        ts = best_time(tb, a.repeats)
        result["torch_block_fwd_bwd_s"] = round(ts, 5)
        result["torch_threads"] = torch.get_num_threads()
        # torch's BLAS (MKL, its own threads) on the same product: the block is ~80% products
        n = 2048
        ma, mb, mc = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        result["torch_matmul_peak_gflops"] = round(
            2 * n**3 / best_time(lambda: torch.mm(ma, mb, out=mc), a.repeats) / 1e9, 1
        )
        result["block_time_ratio_numpy_over_torch"] = round(unit_s["block"] / ts, 3)
    else:
        result["torch_block_fwd_bwd_s"] = None  # torch not installed: pip install torch==2.13.0
    print(json.dumps(record("kernels", result)))


if __name__ == "__main__":
    main()

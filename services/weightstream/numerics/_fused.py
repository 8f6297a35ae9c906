"""numba kernels for the float32 elementwise chains numpy runs as one pass per operation.

What they replace, and why: a chain of k numpy ufuncs over a cache-resident block is still k passes,
each paying numpy's dispatch and a temporary, and ``np.exp``/``np.tanh`` are calls LLVM cannot fuse.
Here each chain is one loop nest over rows that stay in L1/L2, the exponential is a polynomial LLVM
vectorizes (numba without Intel's SVML calls libm's scalar ``expf``), and what a chain skips (the
masked half of causal scores) is never read. Measured on a GPT-2 block (768/12, T256, B8), per
forward+backward: the attention's softmax 3.4 ms less, its gradient 1 ms, the GELU 3.5 ms.

Which kernels run: float32 arrays only (the workers' dtype); float64 (the gradient checks) keeps the
numpy path, written as the formulas read. The float32 results differ from that path in the last bits,
and are checked against PyTorch and against float64 in the tests.

Accuracy of ``_exp``: Cody-Waite reduction t = q ln2 + r, |r| <= ln2/2, e^r by its Taylor polynomial to
degree 7 (truncation < 6e-9 relative, under float32's half ulp), 2^q built in the exponent bits. Within
2 ulp of exp over [-86, 86]; inputs are clamped to that range, so results (and the GELU's 1 / (1 + e))
never go subnormal (an x86 multiply on a subnormal takes a ~100-cycle microcode assist) nor overflow:
below -86 exp is taken as e^-86 ~ 4e-38, nothing next to the 1 a softmax sum or a 1 + e always holds.
In the softmax, NaN and inf scores give NaN (the clamp would otherwise hide them), so non-finite numbers
still surface; the GELU's z h(z) carries a NaN z through by itself (and gives +-inf for +-inf).

Determinism: every sum runs in one fixed order (over keys, one after another, for each query); nothing
here is threaded (callers split the work along whole heads or rows, as for numpy). ``fastmath`` is only
``contract`` (a multiply and add fused into one FMA, fixed in the compiled code).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

__all__ = [
    "exp_into",
    "gelu_erf_rows",
    "gelu_tanh_rows",
    "multiply_sum_columns",
    "softmax_keys",
    "softmax_keys_grad",
    "square_sum",
]

_F = np.float32
_LOG2E = _F(1.0 / math.log(2.0))
_LN2_HI = _F(0.693359375)  # ln 2 = HI + LO, HI with 9 significant bits: q * HI is exact for |q| < 2^15
_LN2_LO = _F(math.log(2.0) - 0.693359375)
_ROUND = _F(1.5 * 2**23)  # (x + 1.5 2^23) - 1.5 2^23 rounds x to the nearest integer in float32
# e^-86 > 2^-126, the smallest normal float32, and so is 1 / (1 + e^86) (the GELU's h for x < -9.7)
_EXP_LO, _EXP_HI = _F(-86.0), _F(86.0)
_C2, _C3, _C4, _C5, _C6, _C7 = (_F(1.0 / math.factorial(i)) for i in range(2, 8))
_ZERO, _ONE, _TWO = _F(0.0), _F(1.0), _F(2.0)
_NEG_INF = _F(-np.inf)
# GELU (tanh form): h = 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), u = k (x + c x^3)
_GK = _F(math.sqrt(2.0 / math.pi))
_GKC = _F(0.044715 * math.sqrt(2.0 / math.pi))
_G2K = _F(2.0 * math.sqrt(2.0 / math.pi))
_G6KC = _F(6.0 * 0.044715 * math.sqrt(2.0 / math.pi))

_OPTIONS: dict[str, Any] = {"nogil": True, "boundscheck": False, "fastmath": {"contract"}}


def _jit(fn: Callable[..., Any]) -> Any:
    """``njit`` with the on-disk cache when some cache dir is writable, in-memory compilation otherwise."""
    try:
        return njit(cache=True, **_OPTIONS)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available" (read-only install)
        return njit(cache=False, **_OPTIONS)(fn)


def _inline(fn: Callable[..., Any]) -> Any:
    """``njit`` with ``inline="always"``: numba inlines the function into each kernel that calls it."""
    return njit(inline="always", **_OPTIONS)(fn)


# Loops index views with range(len): LLVM vectorizes those, not loops over range(lo, hi) (numba's
# negative-index wraparound check stays in their body).
@_inline
def _exp(a: np.ndarray, bits: np.ndarray, surface: bool) -> None:
    """a[:] = exp(a), float32 with unit stride, in place; ``bits`` int32 scratch at least as long. With
    ``surface`` (a constant: LLVM drops the other branch) NaN and +-inf inputs give NaN."""
    for i in range(a.shape[0]):
        t = a[i]
        nan = (t - t) if surface else _ZERO  # 0, or NaN where t is NaN or inf: added back after the clamp
        t = t if t > _EXP_LO else _EXP_LO
        t = t if t < _EXP_HI else _EXP_HI
        q = (t * _LOG2E + _ROUND) - _ROUND
        r = (t - q * _LN2_HI) - q * _LN2_LO
        a[i] = (_ONE + r * (_ONE + r * (_C2 + r * (_C3 + r * (_C4 + r * (_C5 + r * (_C6 + r * _C7))))))) + nan
        bits[i] = (np.int32(q) + np.int32(127)) << np.int32(23)  # 2^q's float32 bits
    scale = bits.view(np.float32)
    for i in range(a.shape[0]):
        a[i] *= scale[i]


@_jit
def exp_into(a: np.ndarray) -> None:
    """a[:] = exp(a) for a 1-D float32 array, in place (the kernels' exponential, for tests)."""
    _exp(a, np.empty(a.shape[0], np.int32), True)


@_jit
def softmax_keys(p: np.ndarray, c0: int, c1: int) -> None:
    """Causal softmax over keys, in place, for queries c0:c1 of p [G, T, T] (scores key-major, p[g, key,
    query]). Key j is visible to query i when j <= i; masked entries are written 0 and never read, so
    they may hold anything (the products skip them)."""
    n_groups, t, _ = p.shape
    w = c1 - c0
    top = min(t, c1)  # keys from c1 on are masked for every query of the slab
    mx = np.empty(w, np.float32)  # [W] running max per query
    sm = np.empty(w, np.float32)  # [W] sum of exponentials, then its inverse
    bits = np.empty(w, np.int32)
    for g in range(n_groups):
        mx[:] = _NEG_INF
        sm[:] = _ZERO
        for j in range(top):
            lo = max(j, c0)
            row, m = p[g, j, lo:c1], mx[lo - c0 :]
            for i in range(row.shape[0]):
                x, y = row[i], m[i]
                m[i] = x if x > y else y  # a NaN score is lost here, but comes back through exp below
        for j in range(top):
            lo = max(j, c0)
            p[g, j, c0:lo] = _ZERO
            row, m, s = p[g, j, lo:c1], mx[lo - c0 :], sm[lo - c0 :]
            for i in range(row.shape[0]):
                row[i] -= m[i]
            _exp(row, bits, True)
            for i in range(row.shape[0]):
                s[i] += row[i]
        for j in range(top, t):
            p[g, j, c0:c1] = _ZERO
        for i in range(w):
            sm[i] = _ONE / sm[i]
        for j in range(top):
            lo = max(j, c0)
            row, s = p[g, j, lo:c1], sm[lo - c0 :]
            for i in range(row.shape[0]):
                row[i] *= s[i]


@_jit
def softmax_keys_grad(g: np.ndarray, p: np.ndarray, c0: int, c1: int) -> None:
    """g = p (g - delta) in place for queries c0:c1, delta[query] = sum over keys of g p: the softmax
    gradient, with g [G, T, T] the gradient of the probabilities p (both key-major, as ``softmax_keys``).
    Masked entries of g are written 0 and never read."""
    n_groups, t, _ = g.shape
    w = c1 - c0
    top = min(t, c1)
    delta = np.empty(w, np.float32)  # [W]
    for h in range(n_groups):
        delta[:] = _ZERO
        for j in range(top):
            lo = max(j, c0)
            gr, pr, d = g[h, j, lo:c1], p[h, j, lo:c1], delta[lo - c0 :]
            for i in range(gr.shape[0]):
                d[i] += gr[i] * pr[i]
        for j in range(top):
            lo = max(j, c0)
            g[h, j, c0:lo] = _ZERO
            gr, pr, d = g[h, j, lo:c1], p[h, j, lo:c1], delta[lo - c0 :]
            for i in range(gr.shape[0]):
                gr[i] = pr[i] * (gr[i] - d[i])
        for j in range(top, t):
            g[h, j, c0:c1] = _ZERO


@_jit
def gelu_tanh_rows(x: np.ndarray, bias: np.ndarray, y: np.ndarray, d: np.ndarray) -> None:
    """For rows z = x + bias [N, F]: y = z h(z) and d = dy/dz = h + z h', h = 1 / (1 + e^(-2u)),
    u = k (z + c z^3) (GPT-2's tanh GELU, 0.5 (1 + tanh u) = h), h' = 2 h (1 - h) k (1 + 3 c z^2).
    ``y`` may be ``x``."""
    n, f = x.shape
    bits = np.empty(f, np.int32)
    for r in range(n):
        xr, yr, dr = x[r], y[r], d[r]
        for i in range(f):
            z = xr[i] + bias[i]
            dr[i] = z  # z waits in d's row (in L1) while y's row takes -2u, then e^(-2u)
            yr[i] = -_TWO * z * (_GK + _GKC * z * z)
        _exp(yr, bits, False)  # z h(z) is NaN for a NaN z anyway, +-inf for +-inf
        for i in range(f):
            z = dr[i]
            h = _ONE / (_ONE + yr[i])
            dr[i] = h + z * h * (_ONE - h) * (_G2K + _G6KC * z * z)
            yr[i] = z * h


# GELU (erf form): Phi(z) = 0.5 erfc(-z / sqrt 2), erfc(u) = t e^(-u^2 + P(t)) for u >= 0, t = 1 / (1 + u/2):
# the Chebyshev fit of Numerical Recipes' erfcc (Press et al., 6.2), relative error < 1.2e-7 everywhere, so
# Phi keeps its relative precision in the negative tail (1 - erfc would cancel there).
_ERFC = tuple(
    _F(c)
    for c in (
        -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
        0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
    )
)  # fmt: skip
_HALF = _F(0.5)
_INV_SQRT2 = _F(1.0 / math.sqrt(2.0))
_INV_SQRT_2PI = _F(1.0 / math.sqrt(2.0 * math.pi))


@_jit
def gelu_erf_rows(x: np.ndarray, bias: np.ndarray, y: np.ndarray, d: np.ndarray) -> None:
    """For rows z = x + bias [N, F]: y = z Phi(z) and d = dy/dz = Phi(z) + z phi(z), Phi the standard
    normal CDF and phi its density, e^(-z^2/2) / sqrt(2 pi) (the exact GELU: Hugging Face's and torch's
    ``gelu``, ModelZoo's ``nonlinearity: gelu``). Two exponentials an element, each ``_exp``, where numpy
    called scipy's scalar erf. ``y`` may be ``x``."""
    n, f = x.shape
    bits = np.empty(f, np.int32)
    zs = np.empty(f, np.float32)  # z and t wait here (in L1) while y's and d's rows take the exponents
    ts = np.empty(f, np.float32)
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = _ERFC
    for r in range(n):
        xr, yr, dr = x[r], y[r], d[r]
        for i in range(f):
            z = xr[i] + bias[i]
            u = abs(z) * _INV_SQRT2
            t = _ONE / (_ONE + _HALF * u)
            zs[i], ts[i] = z, t
            hi = c5 + t * (c6 + t * (c7 + t * (c8 + t * c9)))
            poly = c0 + t * (c1 + t * (c2 + t * (c3 + t * (c4 + t * hi))))  # Horner, degree 9
            yr[i] = poly - u * u  # erfc(u) = t e^(this)
            dr[i] = -u * u  # phi(z) sqrt(2 pi) = e^(this)
        _exp(yr, bits, False)  # a NaN z stays NaN through t below; +-inf give exponents clamped at -86
        _exp(dr, bits, False)
        for i in range(f):
            z = zs[i]
            half_erfc = _HALF * ts[i] * yr[i]  # Phi(-|z|)
            cdf = half_erfc if z < _ZERO else _ONE - half_erfc
            yr[i] = z * cdf
            dr[i] = cdf + z * (dr[i] * _INV_SQRT_2PI)


@_jit
def multiply_sum_columns(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, sums: np.ndarray, c0: int, c1: int
) -> None:
    """out[:, c0:c1] = a * b there, and sums[c0:c1] = its column sums, added row after row (the order of
    numpy's ``add.reduce`` over axis 0), in one pass instead of two. ``out`` may be ``a``."""
    s = sums[c0:c1]
    s[:] = _ZERO
    for r in range(a.shape[0]):
        ar, br, o = a[r, c0:c1], b[r, c0:c1], out[r, c0:c1]
        for i in range(ar.shape[0]):
            v = ar[i] * br[i]
            o[i] = v
            s[i] += v


_LANES = 16  # partial sums of square_sum: one AVX-512 register of float64, or two AVX2 ones


@_jit
def square_sum(a: np.ndarray) -> float:
    """Sum of a[i]^2 over a float32 vector, in float64: a gradient's part of the global norm (MemoryX's
    clipping). Element i goes to partial sum i % 16, the tail in order after, then the 16 partials in
    order: a fixed order (whatever the thread or the alignment), so reruns are bitwise equal. One pass,
    ~3x faster than numpy's float64 ``einsum`` over float32, which converts the vector in buffers first."""
    acc = np.zeros(_LANES, np.float64)
    n = a.shape[0] // _LANES * _LANES
    for i in range(0, n, _LANES):
        for j in range(_LANES):
            x = np.float64(a[i + j])
            acc[j] += x * x
    total = 0.0
    for i in range(n, a.shape[0]):
        x = np.float64(a[i])
        total += x * x
    for j in range(_LANES):
        total += acc[j]
    return total

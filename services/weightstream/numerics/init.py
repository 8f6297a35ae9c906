"""ModelZoo's weight initializers (``model.initializer`` and friends) as pure numpy.

Each kind draws exactly what ``torch.nn.init``'s function of that name draws in distribution (ModelZoo's
``layers/init.py`` calls them), from a numpy stream the caller seeds per tensor, so one tensor's values
depend on (seed, name) alone and are bitwise the same on every rerun.

The fan-based kinds (xavier, kaiming, variance scaling) need the (fan_in, fan_out) of the *torch* layer
ModelZoo builds for the tensor: torch's rule on an ``nn.Linear`` weight [out, in] is (in, out) and on an
``nn.Embedding`` [num, dim] is (dim, num). A tensor stored another way (GPT-2's Conv1D weights are
[in, out]; its ``c_attn`` fuses three [C, C] projections) passes its fans explicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["InitKind", "Initializer", "fans_of", "sample"]

InitKind = Literal[
    "constant",
    "ones",
    "zeros",
    "uniform",
    "normal",
    "truncated_normal",
    "xavier_normal",
    "xavier_uniform",
    "kaiming_normal",
    "kaiming_uniform",
    "variance_scaling",
]

# scipy.stats.truncnorm.std(a=-2, b=2): ModelZoo's variance_scaling divides by it, as TensorFlow does
_TRUNC_STD_2 = 0.87962566103423978
_CHUNK = 1 << 20  # elements per step of the truncated normal's float64 pass: 8 MiB per temporary


@dataclass(frozen=True)
class Initializer:
    """One resolved initializer: its kind and every parameter it uses (the others are ignored).

    - constant: ``val``. ones, zeros: none.
    - uniform: U[a, b). normal: N(mean, std^2).
    - truncated_normal: N(mean, std^2) conditioned on [a, b]; ``a`` and ``b`` are absolute bounds, as in
      ``torch.nn.init.trunc_normal_``.
    - xavier_normal, xavier_uniform: ``gain``.
    - kaiming_normal, kaiming_uniform: ``a`` (the leaky ReLU's negative slope), ``mode`` (fan_in or
      fan_out), ``nonlinearity`` (leaky_relu or relu).
    - variance_scaling (and ModelZoo's lecun_normal, lecun_uniform): ``scale``, ``mode`` (also fan_avg),
      ``distribution``.
    """

    kind: InitKind
    mean: float = 0.0
    std: float = 0.05
    a: float = 0.0
    b: float = 0.0
    val: float = 0.0
    gain: float = 1.0
    scale: float = 1.0
    mode: Literal["fan_in", "fan_out", "fan_avg"] = "fan_in"
    nonlinearity: Literal["leaky_relu", "relu"] = "leaky_relu"
    distribution: Literal["uniform", "normal", "truncated_normal"] = "truncated_normal"


def fans_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """torch's ``_calculate_fan_in_and_fan_out`` for a tensor stored as torch stores it: (dim 1, dim 0),
    each times the receptive field (the product of the dims after the first two)."""
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need at least 2 dimensions (shape {shape})")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def sample(
    init: Initializer,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    fans: tuple[int, int] | None = None,
) -> np.ndarray:
    """A float32 tensor of ``shape`` drawn by ``init`` from ``rng``. ``fans`` = (fan_in, fan_out) of the
    torch layer the tensor stands for; None: ``fans_of(shape)``. Only the fan-based kinds read them."""
    kind = init.kind
    if kind in ("constant", "ones", "zeros"):
        return np.full(shape, {"ones": 1.0, "zeros": 0.0}.get(kind, init.val), dtype=np.float32)
    if kind == "uniform":
        return _uniform(rng, shape, init.a, init.b)
    if kind == "normal":
        return _normal(rng, shape, init.mean, init.std)
    if kind == "truncated_normal":
        return _truncated_normal(rng, shape, init.mean, init.std, init.a, init.b)
    fan_in, fan_out = fans if fans is not None else fans_of(shape)
    if kind in ("xavier_normal", "xavier_uniform"):
        std = init.gain * math.sqrt(2.0 / (fan_in + fan_out))
        if kind == "xavier_normal":
            return _normal(rng, shape, 0.0, std)
        bound = math.sqrt(3.0) * std
        return _uniform(rng, shape, -bound, bound)
    if kind in ("kaiming_normal", "kaiming_uniform"):
        # torch.nn.init.calculate_gain: relu ignores the slope
        gain = math.sqrt(2.0) if init.nonlinearity == "relu" else math.sqrt(2.0 / (1 + init.a**2))
        std = gain / math.sqrt(fan_in if init.mode == "fan_in" else fan_out)
        if kind == "kaiming_normal":
            return _normal(rng, shape, 0.0, std)
        bound = math.sqrt(3.0) * std
        return _uniform(rng, shape, -bound, bound)
    if kind == "variance_scaling":
        denom = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[init.mode]
        variance = init.scale / max(1.0, denom)
        if init.distribution == "normal":
            return _normal(rng, shape, 0.0, math.sqrt(variance))
        if init.distribution == "uniform":
            bound = math.sqrt(3.0 * variance)
            return _uniform(rng, shape, -bound, bound)
        # ModelZoo calls trunc_normal_(tensor, std=...) and so keeps torch's default bounds: -2 and 2
        # absolute, not 2 std (at the usual small std that cuts nothing, and the std comes out 1/0.88
        # times TensorFlow's). What trains in ModelZoo is what we draw.
        return _truncated_normal(rng, shape, 0.0, math.sqrt(variance) / _TRUNC_STD_2, -2.0, 2.0)
    raise ValueError(f"unknown initializer kind {kind!r}")


def _normal(rng: np.random.Generator, shape: tuple[int, ...], mean: float, std: float) -> np.ndarray:
    """N(mean, std^2) in float32. With mean 0 these are bitwise ParamSpec's ``normal`` numbers (model.py):
    the same stream, scaled the same way (an untied LM head's draw, normal(0, initializer_range))."""
    t = rng.standard_normal(shape, dtype=np.float32)
    t *= np.float32(std)
    if mean != 0.0:  # skipped at 0: adding +0.0 would turn -0.0 into +0.0
        t += np.float32(mean)
    return t


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], a: float, b: float) -> np.ndarray:
    """U[a, b) in float32 (float32 draws: no float64 copy of an embedding-sized tensor)."""
    t = rng.random(shape, dtype=np.float32)
    t *= np.float32(b - a)
    t += np.float32(a)
    return t


def _truncated_normal(
    rng: np.random.Generator, shape: tuple[int, ...], mean: float, std: float, a: float, b: float
) -> np.ndarray:
    """N(mean, std^2) conditioned on [a, b] by the inverse CDF, as torch's ``trunc_normal_`` (a uniform
    draw between the bounds' CDF values, mapped back through the normal quantile), in float64, chunk by
    chunk (each float64 draw takes one word of the stream, so the chunking never changes the values)."""
    from scipy.special import ndtr, ndtri  # here, not at the top: scipy.special costs ~0.15 s to import

    alpha, beta = (a - mean) / std, (b - mean) / std  # the bounds in standard units
    # Both bounds above the mean: draw the mirror image below it, where the CDF values are small and
    # keep their precision (near 1 they would round together).
    flip = alpha > 0
    if flip:
        alpha, beta = -beta, -alpha
    lo, hi = float(ndtr(alpha)), float(ndtr(beta))
    out = np.empty(shape, dtype=np.float32)
    flat = out.reshape(-1)  # [numel] view
    for start in range(0, flat.size, _CHUNK):
        n = min(_CHUNK, flat.size - start)
        z = ndtri(lo + rng.random(n) * (hi - lo))  # [n] float64 standard normals in [alpha, beta]
        if flip:
            np.negative(z, out=z)
        z *= std
        z += mean
        np.clip(z, a, b, out=z)  # rounding at the ends of the quantile, as torch clamps
        flat[start : start + n] = z
    return out

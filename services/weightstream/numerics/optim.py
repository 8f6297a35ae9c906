"""Optimizers, learning-rate schedules and gradient clipping: the math MemoryX runs.

Every update works in place on flat arrays (a parameter, its gradient, its state buffers), vectorised,
with one scratch buffer at most. The order of operations follows ``torch.optim`` (single-tensor path) so
the results agree to float32 rounding. ``step`` is the 1-based count of this update (Adam's bias
correction), while schedules take the 0-based index of the training step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "SPLIT_UPDATE",
    "SUM_BLOCK",
    "UPDATE_BLOCK",
    "OptimizerConfig",
    "ScheduleKind",
    "SchedulePiece",
    "adam_step",
    "add_sq_sum",
    "clip_coefficient",
    "grad_sq_sum",
    "init_state",
    "is_bias_or_norm",
    "learning_rate_at",
    "optimizer_step",
    "sgd_step",
    "state_names",
    "update_blocks",
]

OptimizerKind = Literal["adamw", "adam", "sgd"]
# A tensor at least this large (elements) is updated in two halves at once where ``optimizer_step`` is given
# a helper thread: below it, handing half to the thread costs about what it saves.
SPLIT_UPDATE = 1 << 18


def adam_step(
    param: np.ndarray,
    grad: np.ndarray,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
    scratch: np.ndarray | None = None,
) -> None:
    """Adam (``decoupled=False``: L2 added to the gradient) or AdamW (decoupled decay). In place.

    ``grad`` is read-only unless Adam's L2 term is on, in which case it is overwritten.
    """
    dt = param.dtype.type
    if weight_decay != 0.0:
        if decoupled:
            param *= dt(1.0 - lr * weight_decay)
        else:
            grad += dt(weight_decay) * param
    # exp_avg = beta1 * exp_avg + (1 - beta1) * grad, as torch's lerp
    exp_avg += dt(1.0 - beta1) * (grad - exp_avg)
    exp_avg_sq *= dt(beta2)
    denom = np.multiply(grad, grad, out=scratch)
    denom *= dt(1.0 - beta2)
    exp_avg_sq += denom
    bias_correction1 = 1.0 - beta1**step
    bias_correction2_sqrt = math.sqrt(1.0 - beta2**step)
    np.sqrt(exp_avg_sq, out=denom)
    denom /= dt(bias_correction2_sqrt)
    denom += dt(eps)
    np.divide(exp_avg, denom, out=denom)
    denom *= dt(-lr / bias_correction1)
    param += denom


def sgd_step(
    param: np.ndarray,
    grad: np.ndarray,
    momentum_buffer: np.ndarray,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
) -> None:
    """SGD with (optionally Nesterov) momentum and L2 weight decay, as ``torch.optim.SGD`` with
    dampening 0. The buffer starts at zero, which makes the first step's buffer equal the gradient
    exactly as torch's clone does. ``grad`` is overwritten."""
    dt = param.dtype.type
    if weight_decay != 0.0:
        grad += dt(weight_decay) * param
    if momentum != 0.0:
        momentum_buffer *= dt(momentum)
        momentum_buffer += grad
        if nesterov:
            grad += dt(momentum) * momentum_buffer
        else:
            grad = momentum_buffer
    param -= dt(lr) * grad


# ---------------------------------------------------------------------------------------------------------
# One entry point for MemoryX: a config, named state buffers per tensor
# ---------------------------------------------------------------------------------------------------------
ScheduleKind = Literal["Constant", "Linear", "CosineDecay", "Exponential", "Polynomial"]


@dataclass(frozen=True)
class SchedulePiece:
    """One piece of a learning-rate schedule, ``total_iters`` steps long, with ModelZoo's names and the
    formulas of its LR schedulers (cerebras.pytorch 2.10: ConstantLR, LinearLR, CosineDecayLR,
    ExponentialLR, PolynomialLR), evaluated in float64. ``end_learning_rate`` is used by Linear,
    CosineDecay and Polynomial; ``decay_rate`` and ``staircase`` by Exponential; ``power`` by Polynomial.

    ModelZoo's ``cycle`` (LinearLR, PolynomialLR) has no field: its factor ceil((t + 1) / total_iters)
    is 1 at every t < total_iters, and from total_iters on ModelZoo returns the end value whatever
    ``cycle`` says, so it never changes a learning rate.
    """

    scheduler: ScheduleKind
    initial_learning_rate: float
    end_learning_rate: float
    total_iters: int
    decay_rate: float = 1.0
    staircase: bool = False
    power: float = 1.0

    def at(self, t: int) -> float:
        """Learning rate ``t`` steps into this piece (t >= 0). Past ``total_iters`` (where only the last
        piece of a schedule goes) Constant, Linear, CosineDecay and Polynomial hold their end value,
        while Exponential keeps decaying, as each does in ModelZoo."""
        if self.scheduler == "Constant":
            return self.initial_learning_rate
        if self.scheduler == "Exponential":
            # integer division: the staircase's floor is exact at any step (ModelZoo floors a float32)
            exponent = t // self.total_iters if self.staircase else t / self.total_iters
            try:
                factor = self.decay_rate**exponent
            except OverflowError:  # decay_rate > 1 long past the end: ModelZoo's float32 gives inf too
                factor = math.inf
            return factor * self.initial_learning_rate
        if self.scheduler == "Polynomial":
            if t >= self.total_iters:
                return self.end_learning_rate
            diff = self.initial_learning_rate - self.end_learning_rate
            # a float: the base is in (0, 1] here (a negative one would give a complex power)
            decay: float = (1.0 - t / self.total_iters) ** self.power
            return decay * diff + self.end_learning_rate
        frac = min(t, self.total_iters) / self.total_iters
        lo, hi = self.end_learning_rate, self.initial_learning_rate
        if self.scheduler == "Linear":
            return hi + (lo - hi) * frac
        return lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * frac))


def learning_rate_at(pieces: Sequence[SchedulePiece], step: int) -> float:
    """The learning rate of 0-based training step ``step``. The pieces run one after another, each
    starting at t = 0 where the one before it ends (ModelZoo's SequentialLR, whose milestones are the
    sums of the total_iters before each piece); the last one runs on past its total_iters."""
    start = 0
    for piece in pieces[:-1]:
        if step < start + piece.total_iters:
            return piece.at(step - start)
        start += piece.total_iters
    return pieces[-1].at(step - start)


@dataclass(frozen=True)
class OptimizerConfig:
    kind: OptimizerKind
    schedule: tuple[SchedulePiece, ...]
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    max_gradient_norm: float | None = None
    exclude_bias_and_norm: bool = True  # ModelZoo's rule: no weight decay on biases and norm weights

    def learning_rate(self, step: int) -> float:
        return learning_rate_at(self.schedule, step)

    def weight_decay_for(self, name: str) -> float:
        """The weight decay of tensor ``name`` (by its Hugging Face name)."""
        return 0.0 if self.exclude_bias_and_norm and is_bias_or_norm(name) else self.weight_decay


def is_bias_or_norm(name: str) -> bool:
    """A bias, or a weight of a normalisation layer: GPT-2's ln_1/ln_2/ln_f, LLaMA's input_layernorm,
    post_attention_layernorm and final norm (as ModelZoo's configure_param_groups tells them apart)."""
    *modules, leaf = name.split(".")
    return leaf == "bias" or any(m.startswith("ln_") or m.endswith("norm") for m in modules)


def state_names(kind: OptimizerKind) -> tuple[str, ...]:
    """The per-tensor state buffers, named as torch names them in ``optimizer.state``."""
    return ("momentum_buffer",) if kind == "sgd" else ("exp_avg", "exp_avg_sq")


def init_state(kind: OptimizerKind, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {n: np.zeros(shape, dtype=np.float32) for n in state_names(kind)}


# The numpy update (SGD; Adam over float64) runs over pieces of this many elements: each elementwise pass
# then stays in L2 instead of streaming whole tensors through DRAM once per operation (measured 8.5x
# faster for Adam on a 24M-parameter tensor, before its float32 kernel). Elementwise math, so the bits
# are those of one whole-tensor pass.
UPDATE_BLOCK = 1 << 15


def optimizer_step(
    cfg: OptimizerConfig,
    param: np.ndarray,
    grad: np.ndarray,
    state: MutableMapping[str, np.ndarray],
    *,
    step: int,
    lr: float,
    scale: float = 1.0,
    weight_decay: float | None = None,
    helper: Executor | None = None,
) -> None:
    """Apply one update to one tensor in place, with the gradient multiplied by ``scale`` first (the
    clipping coefficient). ``grad`` is never written (it may be a read-only mapping). ``weight_decay``:
    this tensor's (``cfg.weight_decay_for(name)``); None: ``cfg.weight_decay``. ``helper``: a thread
    that updates the second half of a large float32 Adam/AdamW tensor meanwhile (every element is
    computed alone, so the result is bitwise that of one pass)."""
    wd = cfg.weight_decay if weight_decay is None else weight_decay
    arrays = [param, grad, *state.values()]
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("optimizer_step works on C-contiguous arrays")
    flat_p, flat_g, *flat_s = (a.reshape(-1) for a in arrays)
    dt = param.dtype.type
    if cfg.kind != "sgd" and all(a.dtype == np.float32 for a in arrays):
        # MemoryX's case: one fused pass, bitwise this loop's result (numerics/_optim_kernels.py)
        from weightstream.numerics._optim_kernels import adam_fused  # numba: imported on first use

        b1, b2 = cfg.betas
        m, v = state["exp_avg"].reshape(-1), state["exp_avg_sq"].reshape(-1)
        scalars = (
            dt(scale),
            dt(1.0 - lr * wd) if cfg.kind == "adamw" else dt(1.0),
            dt(wd),
            cfg.kind == "adam" and wd != 0.0,
            dt(1.0 - b1),
            dt(b2),
            dt(1.0 - b2),
            dt(math.sqrt(1.0 - b2**step)),
            dt(cfg.eps),
            dt(-lr / (1.0 - b1**step)),
        )
        half, second = 0, None
        if helper is not None and flat_p.size >= SPLIT_UPDATE:  # the kernel releases the GIL: two cores
            half = flat_p.size // 2
            second = helper.submit(adam_fused, flat_p[half:], flat_g[half:], m[half:], v[half:], *scalars)
        try:
            end = half or None
            adam_fused(flat_p[:end], flat_g[:end], m[:end], v[:end], *scalars)
        finally:  # never return while the helper still writes
            if second is not None:
                second.result()
        return
    for start in range(0, flat_p.size, UPDATE_BLOCK):
        piece = slice(start, start + UPDATE_BLOCK)
        p, g = flat_p[piece], flat_g[piece] * dt(scale) if scale != 1.0 else flat_g[piece].copy()
        st = dict(zip(state, (a[piece] for a in flat_s), strict=True))
        if cfg.kind == "sgd":
            sgd_step(
                p,
                g,
                st["momentum_buffer"],
                lr=lr,
                momentum=cfg.momentum,
                weight_decay=wd,
                nesterov=cfg.nesterov,
            )
        else:
            b1, b2 = cfg.betas
            adam_step(
                p,
                g,
                st["exp_avg"],
                st["exp_avg_sq"],
                step=step,
                lr=lr,
                beta1=b1,
                beta2=b2,
                eps=cfg.eps,
                weight_decay=wd,
                decoupled=cfg.kind == "adamw",
            )


def update_blocks(
    cfg: OptimizerConfig, names: Sequence[str], blocks: Sequence[np.ndarray], **kw: Any
) -> None:
    """``optimizer_step`` on one block of a tensor as a store hands it: weight, gradient, then the state
    buffers in the order of ``names`` (``state_names``); ``kw``: ``optimizer_step``'s keywords."""
    w, g, *st = blocks
    optimizer_step(cfg, w, g, dict(zip(names, st, strict=True)), **kw)


# ---------------------------------------------------------------------------------------------------------
# Global gradient-norm clipping, split so that each MemoryX shard computes its part
# ---------------------------------------------------------------------------------------------------------
# The sum of squares runs over fixed blocks of this many elements, each summed in float64 and added in
# order: a MemoryX shard that reads a gradient from disk block by block (any multiple of this size) then
# gets bitwise the sum that one holding it in RAM gets.
SUM_BLOCK = 1 << 20


def add_sq_sum(total: float, flat: np.ndarray) -> float:
    """``total`` plus the sum of squares of ``flat`` (which starts on a SUM_BLOCK boundary). A float32
    vector (MemoryX's gradients) goes through a numba kernel, in a fixed order (``_fused.square_sum``);
    anything else through numpy's float64 ``einsum``."""
    if flat.dtype == np.float32 and flat.flags.c_contiguous:
        from weightstream.numerics._fused import square_sum  # numba: imported on first use
    else:

        def square_sum(part: np.ndarray) -> float:
            return float(np.einsum("i,i->", part, part, dtype=np.float64))

    for start in range(0, flat.size, SUM_BLOCK):
        total += float(square_sum(flat[start : start + SUM_BLOCK]))
    return total


def grad_sq_sum(grad: np.ndarray) -> float:
    """Sum of squares of one gradient, accumulated in float64 (a shard adds these up)."""
    return add_sq_sum(0.0, grad.reshape(-1))


def clip_coefficient(sq_sums: Iterable[float], max_norm: float | None) -> tuple[float, float]:
    """(global norm, factor to multiply every gradient by), as ``torch.nn.utils.clip_grad_norm_``."""
    total_norm = math.sqrt(sum(sq_sums))
    if max_norm is None:
        return total_norm, 1.0
    return total_norm, min(1.0, max_norm / (total_norm + 1e-6))

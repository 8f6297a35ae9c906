"""Optimizers, schedules and clipping against torch.optim, step for step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.executors import CountingHelper
from weightstream.numerics.optim import (
    SPLIT_UPDATE,
    SUM_BLOCK,
    UPDATE_BLOCK,
    OptimizerConfig,
    OptimizerKind,
    SchedulePiece,
    adam_step,
    add_sq_sum,
    clip_coefficient,
    grad_sq_sum,
    init_state,
    learning_rate_at,
    optimizer_step,
    sgd_step,
)

if TYPE_CHECKING:
    from torch.optim import Optimizer  # only annotates: torch itself is imported or the module skipped below

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)

SHAPES = [(7, 5), (13,), (3, 4, 2)]
SCHEDULE = (
    SchedulePiece("Linear", 0.0, 1e-2, 5),
    SchedulePiece("CosineDecay", 1e-2, 1e-3, 10),
    SchedulePiece("Constant", 5e-4, 5e-4, 1 << 62),
)
CONFIGS = {
    "adamw": OptimizerConfig(
        "adamw", SCHEDULE, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_gradient_norm=0.5
    ),
    "adam": OptimizerConfig(
        "adam", SCHEDULE, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, max_gradient_norm=2.0
    ),
    "sgd": OptimizerConfig("sgd", SCHEDULE, momentum=0.9, weight_decay=0.01, max_gradient_norm=1.0),
    "sgd_nesterov": OptimizerConfig("sgd", SCHEDULE, momentum=0.8, nesterov=True, max_gradient_norm=None),
    "sgd_plain": OptimizerConfig("sgd", SCHEDULE),
}


def _torch_optimizer(cfg: OptimizerConfig, params: list) -> Optimizer:
    if cfg.kind == "adamw":
        return torch.optim.AdamW(
            params, lr=1.0, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
        )
    if cfg.kind == "adam":
        return torch.optim.Adam(
            params, lr=1.0, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
        )
    return torch.optim.SGD(
        params,
        lr=1.0,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay,
        foreach=False,
    )


@pytest.mark.parametrize(
    "dtype,rtol,atol", [(np.float64, 1e-10, 1e-12), (np.float32, 2e-5, 1e-6)], ids=["float64", "float32"]
)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_optimizer_matches_torch_over_20_steps(name: str, dtype, rtol: float, atol: float, rng) -> None:
    cfg = CONFIGS[name]
    ours = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    states = [{k: v.astype(dtype) for k, v in init_state(cfg.kind, s).items()} for s in SHAPES]
    theirs = [torch.tensor(p.copy(), requires_grad=True) for p in ours]
    opt = _torch_optimizer(cfg, theirs)
    for step in range(20):
        grads = [rng.standard_normal(s).astype(dtype) * (3.0 if step % 4 == 0 else 0.3) for s in SHAPES]
        lr = cfg.learning_rate(step)
        # torch: gradients, global-norm clipping, lr for this step, update
        for t, g in zip(theirs, grads, strict=True):
            t.grad = torch.tensor(g.copy())
        if cfg.max_gradient_norm is not None:
            ref_norm = float(torch.nn.utils.clip_grad_norm_(theirs, cfg.max_gradient_norm))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        # ours: the same, split the way MemoryX shards split it (per-tensor sums, then one coefficient)
        norm, coef = clip_coefficient([grad_sq_sum(g) for g in grads], cfg.max_gradient_norm)
        if cfg.max_gradient_norm is not None:
            assert_allclose(norm, ref_norm, rtol=1e-6)
        for p, g, st in zip(ours, grads, states, strict=True):
            g *= dtype(coef)
            optimizer_step(cfg, p, g, st, step=step + 1, lr=lr)
        for p, t in zip(ours, theirs, strict=True):
            assert_allclose(p, t.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"step {step + 1}")
        assert all(p.dtype == dtype for p in ours)


def test_adam_state_matches_torch_names(rng) -> None:
    cfg = CONFIGS["adamw"]
    p = rng.standard_normal(6)
    t = torch.tensor(p.copy(), requires_grad=True)
    opt = _torch_optimizer(cfg, [t])
    g = rng.standard_normal(6)
    t.grad = torch.tensor(g.copy())
    opt.step()
    st = init_state("adamw", (6,))
    st = {k: v.astype(np.float64) for k, v in st.items()}
    optimizer_step(cfg, p, g.copy(), st, step=1, lr=1.0)
    for k in ("exp_avg", "exp_avg_sq"):
        assert_allclose(st[k], opt.state[t][k].numpy(), rtol=1e-12)


def test_schedule_pieces_match_torch_schedulers() -> None:
    base = 1e-2
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    lin = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=7)
    ours = SchedulePiece("Linear", 0.1 * base, base, 7)
    for s in range(12):
        assert_allclose(ours.at(s), opt.param_groups[0]["lr"], rtol=1e-9, err_msg=f"linear step {s}")
        opt.step()
        lin.step()
    opt = torch.optim.SGD([p], lr=base)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=9, eta_min=1e-4)
    ours = SchedulePiece("CosineDecay", base, 1e-4, 9)
    for s in range(10):  # torch's cosine keeps going past T_max (it is periodic); ours holds the end
        assert_allclose(ours.at(s), opt.param_groups[0]["lr"], rtol=1e-9, err_msg=f"cosine step {s}")
        opt.step()
        cos.step()


def test_sequential_schedule() -> None:
    assert learning_rate_at(SCHEDULE, 0) == 0.0
    assert_allclose(learning_rate_at(SCHEDULE, 4), 0.8e-2)
    assert_allclose(learning_rate_at(SCHEDULE, 5), 1e-2)  # the cosine piece starts at its initial value
    assert_allclose(learning_rate_at(SCHEDULE, 10), 1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi / 2)))
    assert learning_rate_at(SCHEDULE, 15) == 5e-4
    assert learning_rate_at(SCHEDULE, 10**6) == 5e-4
    only = (SchedulePiece("Linear", 1.0, 0.0, 4),)
    assert learning_rate_at(only, 4) == 0.0 and learning_rate_at(only, 100) == 0.0


def test_clip_coefficient() -> None:
    assert clip_coefficient([9.0, 16.0], None) == (5.0, 1.0)
    norm, coef = clip_coefficient([9.0, 16.0], 1.0)
    assert norm == 5.0 and coef == pytest.approx(1.0 / (5.0 + 1e-6))
    assert clip_coefficient([0.01], 1.0)[1] == 1.0
    assert grad_sq_sum(np.full((3, 3), 2.0, dtype=np.float32)) == 36.0


@pytest.mark.parametrize("wd", [0.01, 0.0])
@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_update_in_cache_sized_pieces_is_bitwise_one_whole_pass_and_never_writes_the_gradient(
    kind: OptimizerKind, wd: float, rng
) -> None:
    """optimizer_step runs Adam(W) over float32 as one fused numba pass and SGD over UPDATE_BLOCK pieces
    (speed); either way the bits must be those of the numpy formulas in one pass over the whole tensor,
    with the clipping scale applied as a float32 multiply first, non-finite gradients included. The
    gradient may be a read-only mapping from another process: it is never written."""
    cfg = OptimizerConfig(kind=kind, schedule=(), weight_decay=wd, momentum=0.9)
    n = 2 * UPDATE_BLOCK + 123  # pieces, and a short last one
    w0 = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    g[[5, 6, 7, 8]] = [np.inf, -np.inf, np.nan, -0.0]  # what a diverging step sends, and a signed zero
    w0[9] = np.inf
    g.flags.writeable = False
    pieces_w, whole_w = w0.copy(), w0.copy()
    pieces_s, whole_s = init_state(kind, w0.shape), init_state(kind, w0.shape)
    with np.errstate(invalid="ignore"):  # inf - inf, inf / inf: NaN, as intended here
        for step, scale in ((1, 0.5), (2, 1.0)):  # clipped, then not
            optimizer_step(cfg, pieces_w, g, pieces_s, step=step, lr=1e-2, scale=scale)
            g_scaled = g * np.float32(scale)
            if kind == "sgd":
                sgd_step(
                    whole_w,
                    g_scaled,
                    whole_s["momentum_buffer"],
                    lr=1e-2,
                    momentum=0.9,
                    weight_decay=wd,
                    nesterov=False,
                )
            else:
                adam_step(
                    whole_w,
                    g_scaled,
                    whole_s["exp_avg"],
                    whole_s["exp_avg_sq"],
                    step=step,
                    lr=1e-2,
                    beta1=0.9,
                    beta2=0.999,
                    eps=1e-8,
                    weight_decay=wd,
                    decoupled=kind == "adamw",
                )
    assert np.array_equal(pieces_w.view(np.uint32), whole_w.view(np.uint32))  # bits: NaN and -0.0 too
    assert all(np.array_equal(pieces_s[k].view(np.uint32), whole_s[k].view(np.uint32)) for k in whole_s)


@pytest.mark.parametrize("kind", ["adamw", "adam"])
def test_a_helper_thread_takes_half_of_a_large_update_and_the_bits_are_those_of_one_pass(
    kind: OptimizerKind, rng
) -> None:
    """MemoryX updates the first unit's tensors on two cores (``helper``, memoryx/update.py): every element
    is computed alone, so the two halves' bits must be one pass's, signed zeros and non-finite values
    included. A tensor below SPLIT_UPDATE is not handed over (the handover would cost what it saves)."""
    cfg = OptimizerConfig(kind=kind, schedule=(), weight_decay=0.01)
    n = SPLIT_UPDATE + 77  # odd: halves of different lengths
    w0 = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    g[[n // 2 - 1, n // 2, n // 2 + 1, n - 1]] = [np.inf, -0.0, np.nan, 3e38]  # around the seam and the end
    g.flags.writeable = False
    helper = CountingHelper()
    try:
        split_w, whole_w = w0.copy(), w0.copy()
        split_s, whole_s = init_state(kind, w0.shape), init_state(kind, w0.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            for step, scale in ((1, 0.5), (2, 1.0)):
                optimizer_step(cfg, split_w, g, split_s, step=step, lr=1e-2, scale=scale, helper=helper)
                optimizer_step(cfg, whole_w, g, whole_s, step=step, lr=1e-2, scale=scale)
        assert np.array_equal(split_w.view(np.uint32), whole_w.view(np.uint32))
        assert all(np.array_equal(split_s[k].view(np.uint32), whole_s[k].view(np.uint32)) for k in whole_s)
        assert helper.sizes == [n - n // 2] * 2  # the helper took the second half, each step
        small = np.zeros(SPLIT_UPDATE - 1, dtype=np.float32)
        optimizer_step(
            cfg, small, small.copy(), init_state(kind, small.shape), step=1, lr=1e-2, helper=helper
        )
        assert len(helper.sizes) == 2
    finally:
        helper.shutdown()


def test_weight_decay_skips_biases_and_norms_unless_asked() -> None:
    """ModelZoo's parameter groups: biases and normalisation weights (GPT-2's ln_*, LLaMA's *norm) get no
    weight decay; ``exclude_bias_and_norm: False`` decays every tensor."""
    cfg = OptimizerConfig("adamw", SCHEDULE, weight_decay=0.1)
    no_decay = [
        "transformer.h.0.ln_1.weight",
        "transformer.h.3.attn.c_attn.bias",
        "transformer.ln_f.weight",
        "model.layers.2.input_layernorm.weight",
        "model.layers.2.post_attention_layernorm.weight",
        "model.norm.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "fc.0.bias",
    ]
    decay = [
        "transformer.wte.weight",
        "transformer.h.0.mlp.c_fc.weight",
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "lm_head.weight",
        "fc.0.weight",
    ]
    assert [cfg.weight_decay_for(n) for n in no_decay] == [0.0] * len(no_decay)
    assert [cfg.weight_decay_for(n) for n in decay] == [0.1] * len(decay)
    everything = OptimizerConfig("adamw", SCHEDULE, weight_decay=0.1, exclude_bias_and_norm=False)
    assert {everything.weight_decay_for(n) for n in no_decay + decay} == {0.1}


def test_float32_square_sums_run_in_their_documented_order_whatever_the_alignment(rng) -> None:
    """MemoryX's norm part of a float32 gradient: element i into partial sum i % 16, the tail after, then
    the 16 partials, all in float64 (``_fused.square_sum``), block by block (SUM_BLOCK) as before; so a
    copy at another address gives the same bits, and the value is the float64 one to rounding."""
    n = SUM_BLOCK + 16 * 1000 + 7  # two blocks, the second with a tail
    g = rng.standard_normal(n).astype(np.float32)
    want = 0.0
    for start in range(0, n, SUM_BLOCK):
        x = g[start : start + SUM_BLOCK].astype(np.float64)
        rows = x.size // 16
        lanes = np.add.reduce(x[: rows * 16].reshape(rows, 16) ** 2, axis=0)  # row after row, in order
        part = 0.0
        for v in x[rows * 16 :]:
            part += float(v) * float(v)
        for v in lanes:
            part += float(v)
        want += part
    assert grad_sq_sum(g) == want
    shifted = np.empty(n + 1, np.float32)[1:]  # 4 bytes off the allocation's alignment
    shifted[:] = g
    assert add_sq_sum(0.0, shifted) == want
    assert grad_sq_sum(g) == pytest.approx(float(np.sum(g.astype(np.float64) ** 2)), rel=1e-12)
    assert grad_sq_sum(g.astype(np.float64)) == pytest.approx(want, rel=1e-12)  # float64: numpy's einsum

"""Dropout on the attention probabilities (GPT-2's ``attn_pdrop``, ModelZoo's ``attention_dropout_rate``):
the kernel against torch autograd with the same mask and against finite differences; a GPT-2 with it
against Hugging Face's GPT2LMHeadModel in train mode given our masks; masks that depend on (seed, step,
global sample, site) only, so shards and micro-batches draw the full batch's; nothing changes at rate 0,
outside a scope or in evaluation. The params, config.json and start-from-HF ends are in
tests/unit/params/test_attention_dropout.py."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import weightstream.numerics._blocked as blocked
from tests.model_checks import assert_grads_match_finite_differences
from tests.params_files import TINY
from weightstream.numerics import (
    GPT2Config,
    ModelDef,
    build_gpt2,
    forward_backward,
    forward_loss,
    init_params,
)
from weightstream.numerics import attention as A
from weightstream.numerics import gpt2 as G
from weightstream.numerics.dropout import dropout_mask, dropout_scope
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
F = torch.nn.functional

RATE = 0.3
CFG = GPT2Config(
    vocab_size=37, n_positions=12, n_embd=16, n_layer=2, n_head=4, n_inner=40, attention_dropout_rate=RATE
)
SEED, STEP = 7, 11


def _cfg(**changes: Any) -> GPT2Config:
    return GPT2Config(**{**CFG.__dict__, **changes})


def _params(model: ModelDef, rng: np.random.Generator, dtype: type = np.float64) -> dict[str, np.ndarray]:
    """Initial LayerNorm/bias values are 1/0; perturb them so their gradients are exercised fully."""
    return {
        n: (v + 0.05 * rng.standard_normal(v.shape)).astype(dtype)
        for n, v in init_params(model, seed=3).items()
    }


def _batch(rng: np.random.Generator, b: int, t: int = 10, vocab: int = CFG.vocab_size) -> tuple:
    ids = rng.integers(0, vocab, (b, t + 1))
    return ids[:, :-1], ids[:, 1:]


def _site(i: int) -> str:
    return f"transformer.h.{i}.attn.attn_dropout"


def _keep_masks(model: ModelDef, params: Mapping[str, np.ndarray], ids: np.ndarray, first: int) -> list:
    """The masks each block kept for backward (AttentionSaved.keep), forward run under a scope."""
    masks, x = [], ids
    with dropout_scope(SEED, STEP, first_sample=first):
        for unit in model.units:
            x, saved = unit.forward(params, x)
            if unit.name.startswith("h."):
                masks.append(saved[2].keep)  # saved[2]: the block's AttentionSaved
    return masks


# ---------------------------------------------------------------------------------------------------------
# The kernel: torch autograd with the same mask, finite differences
# ---------------------------------------------------------------------------------------------------------
def _torch_attention(qkv: Any, keep: np.ndarray, rate: float, n_head: int) -> Any:
    """softmax(q k^T / sqrt(D), causal) with ``keep`` (ours: [B, H, key, query]) applied as Hugging Face's
    attn_dropout applies its mask (on [B, H, query, key] after the softmax), then times v."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in qkv.split(c, dim=-1))
    scores = q @ k.transpose(-1, -2) / (c // n_head) ** 0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    p = p * torch.as_tensor(keep).transpose(-1, -2).to(p.dtype) / (1.0 - rate)
    return (p @ v).transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("t", [5, 129, 300])
def test_kernel_matches_torch_autograd_with_the_same_mask(
    t: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Around the product block (128) and the softmax slab (256), float64, with the scratch buffers handed
    out full of inf: every entry of the kept-probability buffers that a product reads must be written."""
    monkeypatch.setattr(A, "_uninitialized", lambda shape, dtype: np.full(shape, np.inf, dtype=dtype))
    b, c, h = 2, 24, 6  # 6 heads: groups of 3 per numpy call
    qkv, dy = rng.standard_normal((b, t, 3 * c)), rng.standard_normal((b, t, c))
    keep = rng.random((b, h, t, t)) >= RATE
    ref = torch.tensor(qkv, requires_grad=True)
    out = _torch_attention(ref, keep, RATE, h)
    out.backward(torch.tensor(dy))
    y, saved = A.attention_forward(qkv.copy(), h, keep=keep, rate=RATE)
    assert saved.keep is keep and saved.rate == RATE  # kept for backward, not drawn again
    assert_allclose(y, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert_allclose(A.attention_backward(saved, dy), ref.grad.numpy(), rtol=1e-10, atol=1e-12)
    no_drop, _ = A.attention_forward(qkv.copy(), h)
    assert np.abs(y - no_drop).max() > 0.1  # the mask does something


def test_kernel_in_float32_matches_torch(rng: np.random.Generator) -> None:
    """Workers compute in float32: the kernel keeps the dtype, keep-scale included."""
    b, t, c, h = 2, 140, 32, 4
    qkv = rng.standard_normal((b, t, 3 * c)).astype(np.float32)
    dy = rng.standard_normal((b, t, c)).astype(np.float32)
    keep = rng.random((b, h, t, t)) >= 0.1
    ref = torch.tensor(qkv, requires_grad=True)
    out = _torch_attention(ref, keep, 0.1, h)
    out.backward(torch.tensor(dy))
    y, saved = A.attention_forward(qkv, h, keep=keep, rate=0.1)
    dqkv = A.attention_backward(saved, dy)
    assert y.dtype == dqkv.dtype == np.float32
    assert_allclose(y, out.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert_allclose(dqkv, ref.grad.numpy(), rtol=1e-3, atol=1e-4)


def test_kernel_gradient_matches_finite_differences(rng: np.random.Generator) -> None:
    """Every entry of dqkv of L = sum(y * w) against central differences, one fixed mask."""
    b, t, c, h = 1, 4, 8, 2
    qkv, w = rng.standard_normal((b, t, 3 * c)), rng.standard_normal((b, t, c))
    keep = rng.random((b, h, t, t)) >= 0.4
    _, saved = A.attention_forward(qkv.copy(), h, keep=keep, rate=0.4)
    grad = A.attention_backward(saved, w)
    eps = 1e-6
    for idx in np.ndindex(qkv.shape):
        up, down = qkv.copy(), qkv.copy()
        up[idx] += eps
        down[idx] -= eps
        fd = (
            (A.attention_forward(up, h, keep=keep, rate=0.4)[0] * w).sum()
            - (A.attention_forward(down, h, keep=keep, rate=0.4)[0] * w).sum()
        ) / (2 * eps)
        assert_allclose(grad[idx], fd, rtol=1e-6, atol=1e-8, err_msg=str(idx))


def test_kernel_refuses_a_mask_that_does_not_fit(rng: np.random.Generator) -> None:
    qkv = rng.standard_normal((2, 6, 24))
    with pytest.raises(ValueError, match=r"bool \[2, 4, 6, 6\]"):
        A.attention_forward(qkv, 4, keep=np.ones((2, 4, 6, 5), dtype=bool), rate=0.1)
    with pytest.raises(ValueError, match="bool"):
        A.attention_forward(qkv, 4, keep=np.ones((2, 4, 6, 6)), rate=0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        A.attention_forward(qkv, 4, keep=np.ones((2, 4, 6, 6), dtype=bool), rate=1.0)


# ---------------------------------------------------------------------------------------------------------
# GPT-2: Hugging Face with our masks, finite differences
# ---------------------------------------------------------------------------------------------------------
def test_gpt2_matches_hugging_face_in_train_mode_given_our_masks(rng: np.random.Generator) -> None:
    """transformers' GPT2LMHeadModel (eager attention, train mode, attn_pdrop = the rate) with its
    attention-probability dropout replaced by our masks, in layer order: the same loss and gradients, so
    our masks sit where Hugging Face's attn_pdrop acts (test_dropout.py does the other dropout sites)."""
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    cfg = CFG
    model = build_gpt2(cfg)
    params = _params(model, rng)
    ids, targets = _batch(rng, b=3)
    with dropout_scope(SEED, STEP, first_sample=2):
        loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)
        masks = {_site(i): dropout_mask(_site(i), (3, cfg.n_head, 10, 10), RATE) for i in range(cfg.n_layer)}
    for used, (site, drawn) in zip(_keep_masks(model, params, ids, 2), masks.items(), strict=True):
        assert_array_equal(used, drawn, err_msg=site)  # the masks the blocks used are these
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=cfg.n_inner, layer_norm_epsilon=cfg.layer_norm_epsilon,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=RATE, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager",
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(hf_cfg).double().train()
    state = hf.state_dict()
    with torch.no_grad():
        for n, v in params.items():
            state[n].copy_(torch.from_numpy(v))
    queue = iter(masks.values())  # eager attention calls F.dropout(weights, p=attn_pdrop) once per layer
    applied: list[float] = []

    def dropout(z: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if p == 0.0 or not training:
            return z
        applied.append(p)
        mask = next(queue)
        assert mask is not None
        return z * torch.as_tensor(mask.transpose(0, 1, 3, 2), dtype=z.dtype) / (1.0 - p)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "dropout", dropout)
        logits = hf(input_ids=torch.as_tensor(ids)).logits
    assert applied == [RATE] * cfg.n_layer  # each layer's attention dropout, and nothing else, came here
    ref = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-10)
    hf_grads = {n: t.grad.numpy() for n, t in hf.named_parameters()}
    for name in model.specs:
        assert_allclose(grads[name], hf_grads[name], rtol=1e-8, atol=1e-12, err_msg=name)


def test_gpt2_grads_match_finite_differences_under_a_fixed_scope(rng: np.random.Generator) -> None:
    cfg = _cfg(vocab_size=7, n_positions=5, n_embd=8, n_head=2, n_inner=12, attention_dropout_rate=0.4)
    model = build_gpt2(cfg)
    params = _params(model, rng)
    ids, targets = _batch(rng, b=2, t=4, vocab=7)
    with dropout_scope(SEED, STEP, first_sample=2):  # the same masks for every loss evaluated
        assert_grads_match_finite_differences(model, params, ids, targets, rng, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------
# Masks: a function of the global sample, never of shards or micro-batches
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pieces", [[1, 1, 1, 1], [2, 2], [1, 3]], ids=["micro1", "2workers", "uneven"])
def test_shards_and_micro_batches_draw_the_full_batchs_masks(pieces: list[int], rng) -> None:
    """A global batch of 4 cut into contiguous pieces (micro-batches of 1, two worker shards, 1 + 3), each
    run under ``dropout_scope(seed, step, first_sample=its global offset)``: each piece's masks are the
    full batch's rows, and the pieces' gradients (with the global denominator) sum to the full batch's."""
    model = build_gpt2(CFG)
    params = _params(model, rng)
    ids, targets = _batch(rng, b=4)
    full = _keep_masks(model, params, ids, first=0)
    with dropout_scope(SEED, STEP, first_sample=0):
        loss, grads = forward_backward(model, params, ids, targets, targets.size)
    total, summed, first = 0.0, {n: np.zeros_like(v) for n, v in params.items()}, 0
    for size in pieces:
        rows = slice(first, first + size)
        for got, want in zip(_keep_masks(model, params, ids[rows], first), full, strict=True):
            assert_array_equal(got, want[rows])
        with dropout_scope(SEED, STEP, first_sample=first):
            part_loss, part = forward_backward(model, params, ids[rows], targets[rows], targets.size)
        total += part_loss
        for n, g in part.items():
            summed[n] += g
        first += size
    assert_allclose(total, loss, rtol=1e-12)
    for n in params:
        assert_allclose(summed[n], grads[n], rtol=1e-9, atol=1e-14, err_msg=n)


def test_masks_differ_by_layer_sample_and_step_and_keep_one_minus_the_rate(rng) -> None:
    model = build_gpt2(CFG)
    params = _params(model, rng)
    ids, _ = _batch(rng, b=2)
    ids[1] = ids[0]  # the same tokens: the masks still differ, by global sample index
    (m0, m1) = _keep_masks(model, params, ids, first=0)
    assert m0.shape == (2, CFG.n_head, 10, 10) and m0.dtype == np.bool_
    assert not np.array_equal(m0, m1)  # layers
    assert not np.array_equal(m0[0], m0[1])  # samples
    with dropout_scope(SEED, STEP + 1, first_sample=0):
        other_step = dropout_mask(_site(0), m0.shape, RATE)
        assert other_step is not None and not np.array_equal(other_step, m0)  # steps
    with dropout_scope(SEED, STEP, first_sample=0):
        big = dropout_mask(_site(0), (4, 12, 128, 128), RATE)
    assert big is not None and abs(big.mean() - (1 - RATE)) < 3e-3


def test_thread_count_and_block_size_change_no_bit(rng: np.random.Generator, monkeypatch) -> None:
    cfg = _cfg(n_embd=64, n_inner=128, n_positions=140)
    model = build_gpt2(cfg)
    params = _params(model, rng, np.float32)
    ids, targets = _batch(rng, b=3, t=140)
    outs = []
    for threads, elems in ((blocked.THREADS, 1 << 17), (1, 1 << 17), (3, 1 << 10)):
        monkeypatch.setattr(blocked, "THREADS", threads)
        monkeypatch.setattr(blocked, "_BLOCK_ELEMS", elems)
        with dropout_scope(SEED, STEP, first_sample=0):
            outs.append(forward_backward(model, params, ids, targets, targets.size))
    for loss, grads in outs[1:]:
        assert loss == outs[0][0]
        for n in grads:
            assert_array_equal(grads[n], outs[0][1][n], err_msg=n)


# ---------------------------------------------------------------------------------------------------------
# Rate 0, no scope, evaluation: no attention dropout, and not a bit changed
# ---------------------------------------------------------------------------------------------------------
def _same_bits(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    for n in a[1]:
        assert_array_equal(a[1][n], b[1][n], err_msg=n)


def test_rate_0_and_no_scope_change_no_bit(rng: np.random.Generator, monkeypatch) -> None:
    dropping, plain = build_gpt2(CFG), build_gpt2(_cfg(attention_dropout_rate=0.0))
    params = _params(plain, rng, np.float32)
    ids, targets = _batch(rng, b=3)
    before = forward_backward(plain, params, ids, targets, targets.size)
    _same_bits(forward_backward(dropping, params, ids, targets, targets.size), before)  # no scope
    seen: list[Any] = []
    real = A.attention_forward_t

    def seeing(*a: Any, **k: Any) -> Any:
        seen.append(k["keep"])
        return real(*a, **k)

    monkeypatch.setattr(G, "attention_forward_t", seeing)
    with dropout_scope(SEED, STEP, first_sample=0):
        _same_bits(forward_backward(plain, params, ids, targets, targets.size), before)  # rate 0
    assert seen == [None] * CFG.n_layer  # the kernel ran without a mask: its code path of before


def test_evaluation_runs_without_attention_dropout(tmp_path: Path) -> None:
    """The reference evaluates without a dropout scope (as the worker engine does): its eval loss with
    attention dropout on equals, bit for bit, the one without; its training step does not."""
    raw = copy.deepcopy(TINY)
    raw["runconfig"].update(max_steps=1)
    losses = {}
    for rate in (0.0, 0.5):
        raw["model"]["attention_dropout_rate"] = rate
        trainer = ReferenceTrainer(load_params(raw))
        losses[rate] = (trainer.evaluate(), trainer.gradients(0)[0])
    assert losses[0.5][0] == losses[0.0][0]
    assert abs(losses[0.5][1] - losses[0.0][1]) > 1e-4  # the training loss does see it
    model = build_gpt2(CFG)
    params = init_params(model, seed=1)
    ids, targets = _batch(np.random.default_rng(0), b=2)
    assert forward_loss(model, params, ids, targets, 20) == forward_loss(
        build_gpt2(_cfg(attention_dropout_rate=0.0)), params, ids, targets, 20
    )

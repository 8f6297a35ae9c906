"""GPT-2 dropout (numerics/dropout.py, gpt2.py): the same loss and gradients as PyTorch with the same masks,
finite differences, masks that depend on (seed, step, global sample, site) only, so any split of a global
batch into shards and micro-batches (and any recomputation) gives the full batch's masks, and nothing
changes at rate 0 or outside a scope."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import weightstream.numerics._blocked as blocked
from tests.model_checks import assert_grads_match_finite_differences
from weightstream.numerics import (
    GPT2Config,
    ModelDef,
    build_gpt2,
    forward_backward,
    init_params,
)
from weightstream.numerics import gpt2 as G
from weightstream.numerics.dropout import (
    dropout_mask,
    dropout_scope,
)

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
F = torch.nn.functional

CFG = GPT2Config(
    vocab_size=37,
    n_positions=12,
    n_embd=16,
    n_layer=3,
    n_head=4,
    n_inner=40,
    dropout_rate=0.3,
    embedding_dropout_rate=0.2,
)
SEED, STEP = 7, 11


def _cfg(**changes: Any) -> GPT2Config:
    return GPT2Config(**{**CFG.__dict__, **changes})


def _batch(rng: np.random.Generator, cfg: GPT2Config, b: int, t: int = 10) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, cfg.vocab_size, (b, t + 1))
    return ids[:, :-1], ids[:, 1:]


def _params(model: ModelDef, rng: np.random.Generator, dtype: type = np.float64) -> dict[str, np.ndarray]:
    """Initial LayerNorm/bias values are 1/0; perturb them so their gradients are exercised fully."""
    return {
        n: (v + 0.05 * rng.standard_normal(v.shape)).astype(dtype)
        for n, v in init_params(model, seed=3).items()
    }


def _sites(model: ModelDef) -> dict[str, float]:
    """Every dropout site of a GPT-2 model and its rate, in forward order."""
    sites = {model.units[0].dropout_site: model.units[0].dropout_rate}  # type: ignore[attr-defined]
    for unit in model.units[1:-1]:
        for site in (unit.attn_dropout_site, unit.mlp_dropout_site):  # type: ignore[attr-defined]
            sites[site] = unit.dropout_rate  # type: ignore[attr-defined]
    return sites


def _drawn(model: ModelDef, shape: tuple[int, ...], first_sample: int, seed: int = SEED) -> dict[str, Any]:
    """The masks every site draws for ``shape`` [B, T, C] under a scope, asked through ``dropout_mask``."""
    with dropout_scope(seed, STEP, first_sample):
        return {site: dropout_mask(site, shape, rate) for site, rate in _sites(model).items()}


def _bools(obj: Any) -> Iterator[np.ndarray]:
    """The bool arrays inside a unit's ``saved`` (its dropout masks), in order."""
    if isinstance(obj, np.ndarray):
        if obj.dtype == np.bool_:
            yield obj
    elif isinstance(obj, tuple | list):
        for o in obj:
            yield from _bools(o)


def _used(model: ModelDef, params: Mapping[str, np.ndarray], ids: np.ndarray, first_sample: int) -> list:
    """The masks the units themselves kept for backward, running forward under a scope."""
    masks: list[np.ndarray] = []
    x = ids
    with dropout_scope(SEED, STEP, first_sample):
        for unit in model.units:
            x, saved = unit.forward(params, x)
            masks += _bools(saved)
    return masks


def _torch_logits(
    p: Mapping[str, Any], ids: np.ndarray, cfg: GPT2Config, masks: Mapping[str, np.ndarray | None]
) -> Any:
    """tests/torch_reference.gpt2_logits with Hugging Face GPT-2's dropout sites, given their masks."""

    def drop(z: Any, site: str, rate: float) -> Any:
        m = masks[site]
        return z if m is None else z * torch.as_tensor(m, dtype=z.dtype) / (1.0 - rate)

    b, t = ids.shape
    tids = torch.as_tensor(ids)
    x = drop(
        p["transformer.wte.weight"][tids] + p["transformer.wpe.weight"][:t],
        "transformer.drop",
        cfg.embedding_dropout_rate,
    )
    c, eps, nh = cfg.n_embd, cfg.layer_norm_epsilon, cfg.n_head
    for i in range(cfg.n_layer):
        q = f"transformer.h.{i}."
        h = F.layer_norm(x, (c,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps)
        qkv = h @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
        qq, kk, vv = (z.view(b, t, nh, c // nh).transpose(1, 2) for z in qkv.split(c, dim=-1))
        a = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + drop(
            a @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"],
            q + "attn.resid_dropout",
            cfg.dropout_rate,
        )
        h = F.layer_norm(x, (c,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps)
        h = F.gelu(h @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"], approximate="tanh")
        x = x + drop(
            h @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"], q + "mlp.dropout", cfg.dropout_rate
        )
    x = F.layer_norm(x, (c,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    return x @ head.T


# ---------------------------------------------------------------------------------------------------------
# (a) PyTorch with the same masks, (b) finite differences
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_loss_and_grads_match_torch_with_the_same_masks(tied: bool, rng: np.random.Generator) -> None:
    cfg = _cfg(tie_word_embeddings=tied)
    model = build_gpt2(cfg)
    params = _params(model, rng)
    ids, targets = _batch(rng, cfg, b=3)
    with dropout_scope(SEED, STEP, first_sample=5):
        loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)
    masks = _drawn(model, (3, 10, cfg.n_embd), first_sample=5)
    # the masks dropout_mask gives are the ones the units used, and they do drop something
    used = _used(model, params, ids, first_sample=5)
    assert len(used) == len(masks) == 1 + 2 * cfg.n_layer
    for m, (site, drawn) in zip(used, masks.items(), strict=True):
        assert_array_equal(m, drawn, err_msg=site)
        assert 0.5 < m.mean() < 0.95, site

    tp = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in params.items()}
    logits = _torch_logits(tp, ids, cfg, masks)
    ref = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-10)
    assert set(grads) == set(model.specs)
    for name in model.specs:
        assert_allclose(grads[name], tp[name].grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)


def test_sites_are_hugging_faces_dropout_modules(rng: np.random.Generator) -> None:
    """transformers' GPT2LMHeadModel in train mode, each of its dropout modules named by one of our sites
    replaced by that site's mask: the same loss and gradients, so each mask sits where HF's dropout does."""
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    model = build_gpt2(CFG)
    params = _params(model, rng)
    ids, targets = _batch(rng, CFG, b=3)
    with dropout_scope(SEED, STEP, first_sample=1):
        loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)
    hf_cfg = transformers.GPT2Config(
        vocab_size=CFG.vocab_size, n_positions=CFG.n_positions, n_embd=CFG.n_embd, n_layer=CFG.n_layer,
        n_head=CFG.n_head, n_inner=CFG.n_inner, layer_norm_epsilon=CFG.layer_norm_epsilon,
        resid_pdrop=CFG.dropout_rate, embd_pdrop=CFG.embedding_dropout_rate, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(hf_cfg).double().train()
    state = hf.state_dict()
    with torch.no_grad():
        for n, v in params.items():
            state[n].copy_(torch.from_numpy(v))

    from torch import nn  # typed where the module-level torch (importorskip's) is not

    class FixedMask(nn.Module):
        def __init__(self, mask: np.ndarray, rate: float) -> None:
            super().__init__()
            self.mask, self.rate = torch.as_tensor(mask, dtype=torch.float64), rate

        def forward(self, z: Any) -> Any:
            return z * self.mask / (1.0 - self.rate)

    for site, mask in _drawn(model, (3, 10, CFG.n_embd), first_sample=1).items():
        parent, _, child = site.rpartition(".")
        assert isinstance(hf.get_submodule(site), torch.nn.Dropout), site
        setattr(hf.get_submodule(parent), child, FixedMask(mask, _sites(model)[site]))
    logits = hf(input_ids=torch.as_tensor(ids)).logits
    ref = F.cross_entropy(logits.reshape(-1, CFG.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-10)
    hf_grads = {n: t.grad.numpy() for n, t in hf.named_parameters()}
    for name in model.specs:
        assert_allclose(grads[name], hf_grads[name], rtol=1e-8, atol=1e-12, err_msg=name)


def test_float32_matches_torch_with_the_same_masks(rng: np.random.Generator) -> None:
    """Workers compute in float32: the dropout kernels keep the dtype (scale included)."""
    model = build_gpt2(CFG)
    params = _params(model, rng, np.float32)
    ids, targets = _batch(rng, CFG, b=2)
    with dropout_scope(SEED, STEP, first_sample=0):
        loss, grads = forward_backward(model, params, ids, targets, denom=targets.size)
    tp = {n: torch.tensor(v, dtype=torch.float32, requires_grad=True) for n, v in params.items()}
    logits = _torch_logits(tp, ids, CFG, _drawn(model, (2, 10, CFG.n_embd), first_sample=0))
    ref = F.cross_entropy(logits.reshape(-1, CFG.vocab_size), torch.as_tensor(targets).reshape(-1))
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-5)
    for name in model.specs:
        assert grads[name].dtype == np.float32, name
        assert_allclose(grads[name], tp[name].grad.numpy(), rtol=1e-3, atol=2e-5, err_msg=name)


def test_grads_match_finite_differences_under_a_fixed_scope(rng: np.random.Generator) -> None:
    cfg = _cfg(vocab_size=7, n_positions=5, n_embd=8, n_layer=2, n_head=2, n_inner=12, dropout_rate=0.4)
    model = build_gpt2(cfg)
    params = _params(model, rng)
    ids, targets = _batch(rng, cfg, b=2, t=4)
    with dropout_scope(SEED, STEP, first_sample=2):  # the same masks for every loss evaluated
        assert_grads_match_finite_differences(model, params, ids, targets, rng, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------
# (c) any split of the global batch, any recomputation: the same masks, the same gradient
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers,micro", [(2, 2), (4, 1), (4, 2)], ids=["2x(2+2)", "4x(1+1)", "4x2"])
def test_shards_and_micro_batches_draw_the_full_batchs_masks(
    workers: int, micro: int, rng: np.random.Generator
) -> None:
    """A global batch of 8 split as the worker engine splits it: contiguous shards, each in micro-batches,
    each forward under ``dropout_scope(seed, step, first_sample=global index of its row 0)``."""
    model = build_gpt2(CFG)
    params = _params(model, rng)
    ids, targets = _batch(rng, CFG, b=8)
    denom = targets.size  # the global batch's token count, on every shard
    with dropout_scope(SEED, STEP, first_sample=0):
        loss, grads = forward_backward(model, params, ids, targets, denom)
    full_masks = _used(model, params, ids, first_sample=0)
    shard = len(ids) // workers
    total, summed = 0.0, {n: np.zeros_like(v) for n, v in params.items()}
    for w in range(workers):
        for k in range(0, shard, micro):
            first = w * shard + k
            rows = slice(first, first + micro)
            with dropout_scope(SEED, STEP, first_sample=first):
                part_loss, part = forward_backward(model, params, ids[rows], targets[rows], denom)
            total += part_loss
            for n, g in part.items():
                summed[n] += g
            for site, full, mine in zip(
                _sites(model), full_masks, _used(model, params, ids[rows], first), strict=True
            ):
                assert_array_equal(mine, full[rows], err_msg=f"{site} rows {rows}")
    assert_allclose(total, loss, rtol=1e-12)
    for n in params:
        assert_allclose(summed[n], grads[n], rtol=1e-9, atol=1e-14, err_msg=n)


def test_a_recomputed_forward_and_a_rerun_are_bitwise_the_same(rng: np.random.Generator) -> None:
    """The worker engine, short of memory, runs a unit's forward again in backward: same scope, same bits."""
    model = build_gpt2(CFG)
    params = _params(model, rng, np.float32)
    ids, targets = _batch(rng, CFG, b=4)
    block = model.units[1]
    x, _ = model.units[0].forward(params, ids)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for _ in range(2):
        with dropout_scope(SEED, STEP, first_sample=4):
            y, saved = block.forward(params, x)
        dx, g = block.backward(params, saved, dy)
        results.append((y, dx, g))
    (y0, dx0, g0), (y1, dx1, g1) = results
    assert_array_equal(y0, y1)
    assert_array_equal(dx0, dx1)
    for n in g0:
        assert_array_equal(g0[n], g1[n], err_msg=n)
    runs = []
    for _ in range(2):
        with dropout_scope(SEED, STEP, first_sample=4):
            runs.append(forward_backward(model, params, ids, targets, targets.size))
    assert runs[0][0] == runs[1][0]
    for n in runs[0][1]:
        assert_array_equal(runs[0][1][n], runs[1][1][n], err_msg=n)


def test_backward_leaves_the_incoming_gradient_alone(rng: np.random.Generator) -> None:
    """dy belongs to the caller (the next unit's dx): the masked copies go to buffers of the unit's own."""
    model = build_gpt2(CFG)
    params = _params(model, rng)
    ids, _ = _batch(rng, CFG, b=2)
    with dropout_scope(SEED, STEP, first_sample=0):
        x, emb_saved = model.units[0].forward(params, ids)
        _, saved = model.units[1].forward(params, x)
    dy = rng.standard_normal(x.shape)
    kept = dy.copy()
    dx, _ = model.units[1].backward(params, saved, dy)
    assert_array_equal(dy, kept)
    assert dx is not None
    kept = dx.copy()
    model.units[0].backward(params, emb_saved, dx)
    assert_array_equal(dx, kept)


def test_thread_count_and_block_size_change_no_bit(rng: np.random.Generator, monkeypatch) -> None:
    """Masks come one generator per sample and the kernels go elementwise over whole rows."""
    cfg = _cfg(n_embd=64, n_inner=256, n_positions=64)  # big enough for several row blocks
    model = build_gpt2(cfg)
    params = _params(model, rng, np.float32)
    ids, targets = _batch(rng, cfg, b=6, t=64)
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
# (d) no scope, or rate 0: exactly what GPT-2 computed before dropout existed
# ---------------------------------------------------------------------------------------------------------
def _step(model: ModelDef, params: Mapping[str, np.ndarray], ids: np.ndarray, targets: np.ndarray) -> tuple:
    return forward_backward(model, params, ids, targets, targets.size)


def _assert_same_bits(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    assert set(a[1]) == set(b[1])
    for n in a[1]:
        assert_array_equal(a[1][n], b[1][n], err_msg=n)


def test_no_scope_is_the_identity_and_rate_0_changes_no_bit(rng: np.random.Generator) -> None:
    dropping, plain = build_gpt2(CFG), build_gpt2(_cfg(dropout_rate=0.0, embedding_dropout_rate=0.0))
    params = _params(plain, rng, np.float32)
    ids, targets = _batch(rng, CFG, b=3)
    before = _step(plain, params, ids, targets)
    _assert_same_bits(_step(dropping, params, ids, targets), before)  # no scope: evaluation, inference
    with dropout_scope(SEED, STEP, first_sample=0):
        _assert_same_bits(_step(plain, params, ids, targets), before)  # rate 0 under a scope
        assert dropout_mask("transformer.drop", (3, 10, 16), 0.0) is None
    assert _drawn(dropping, (3, 10, 16), first_sample=0)["transformer.h.0.mlp.dropout"] is not None


def test_rate_0_runs_todays_fused_kernels_only(rng: np.random.Generator, monkeypatch) -> None:
    """Rate 0 takes the code path of before: no dropout kernel runs, both fused residual kernels do."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dropout kernel ran at rate 0")

    for name in ("dropout_add_bias_residual", "dropout_forward", "dropout_backward"):
        monkeypatch.setattr(G, name, refuse)
    calls: list[str] = []
    for name in ("add_layer_norm_forward", "add_bias_residual"):
        real = getattr(G, name)

        def counted(*a: Any, _f: Any = real, _n: str = name, **k: Any) -> Any:
            calls.append(_n)
            return _f(*a, **k)

        monkeypatch.setattr(G, name, counted)
    model = build_gpt2(_cfg(dropout_rate=0.0, embedding_dropout_rate=0.0))
    params = _params(model, rng)
    ids, targets = _batch(rng, CFG, b=2)
    with dropout_scope(SEED, STEP, first_sample=0):
        _step(model, params, ids, targets)
    assert sorted(calls) == sorted(["add_layer_norm_forward", "add_bias_residual"] * CFG.n_layer)

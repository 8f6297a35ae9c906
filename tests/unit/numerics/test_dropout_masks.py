"""Dropout masks (numerics/dropout.py) on their own: what they depend on, their keep fraction, the scope
that says which samples a forward holds, and the errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from weightstream.numerics import GPT2Config, ModelDef, build_gpt2
from weightstream.numerics.dropout import active_scope, dropout_forward, dropout_mask, dropout_scope, site_id

SEED, STEP = 7, 11
CFG = GPT2Config(vocab_size=37, n_positions=12, n_embd=16, n_layer=3, n_head=4, n_inner=40)


def _cfg(**changes: object) -> GPT2Config:
    return GPT2Config(**{**CFG.__dict__, **changes})


def _sites(model: ModelDef) -> list[str]:
    """Every dropout site of a GPT-2 model, in forward order (the units name them)."""
    sites = [model.units[0].dropout_site]  # type: ignore[attr-defined]
    for unit in model.units[1:-1]:
        sites += [unit.attn_dropout_site, unit.mlp_dropout_site]  # type: ignore[attr-defined]
    return sites


# ---------------------------------------------------------------------------------------------------------
# (e) the masks themselves
# ---------------------------------------------------------------------------------------------------------
def test_masks_differ_by_seed_step_sample_and_site_and_keep_about_1_minus_rate() -> None:
    shape = (4, 256, 256)
    site = "transformer.h.0.mlp.dropout"
    with dropout_scope(1, 2, 0):
        base = dropout_mask(site, shape, 0.1)
        other_site = dropout_mask("transformer.h.1.mlp.dropout", shape, 0.1)
        heavy = dropout_mask(site, shape, 0.6)
    with dropout_scope(1, 3, 0):
        other_step = dropout_mask(site, shape, 0.1)
    with dropout_scope(2, 2, 0):
        other_seed = dropout_mask(site, shape, 0.1)
    assert base is not None and base.dtype == np.bool_ and base.shape == shape
    for m in (other_site, other_step, other_seed):
        assert m is not None
        assert 0.15 < (m != base).mean() < 0.21  # independent masks of rate 0.1 differ on 2 * 0.1 * 0.9
    assert 0.15 < (base[0] != base[1]).mean() < 0.21  # samples differ too
    # 262,144 draws: the keep fraction's std is 6e-4 at rate 0.1, 1e-3 at 0.6
    assert abs(base.mean() - 0.9) < 4e-3
    assert heavy is not None and abs(heavy.mean() - 0.4) < 4e-3
    x = np.ones(shape, np.float32)
    y = dropout_forward(x, base, 0.1)
    assert set(np.unique(y)) == {np.float32(0.0), np.float32(1 / 0.9)}  # kept values scaled by 1/(1-p)


def test_a_mask_row_depends_on_its_global_sample_only() -> None:
    """Which call draws a sample (batch size, position in the call) changes none of its mask."""
    with dropout_scope(SEED, STEP, 0):
        full = dropout_mask("transformer.drop", (7, 5, 6), 0.5)
    with dropout_scope(SEED, STEP, 3):
        part = dropout_mask("transformer.drop", (2, 5, 6), 0.5)
    assert full is not None and part is not None
    assert_array_equal(part, full[3:5])


def test_site_ids_are_stable_and_distinct() -> None:
    sites = _sites(build_gpt2(_cfg(n_layer=96)))  # specs only: no tensors are made
    assert len(sites) == 1 + 2 * 96
    assert len({site_id(s) for s in sites}) == len(sites)
    # a site's masks must be the same in every process and run (Python's hash() is salted per process)
    assert site_id("transformer.drop") == 10024034045791968289
    assert site_id("transformer.h.0.attn.resid_dropout") == 13599618673239907014


# ---------------------------------------------------------------------------------------------------------
# the scope and its errors
# ---------------------------------------------------------------------------------------------------------
def test_scopes_nest_and_are_not_inherited_by_other_threads() -> None:
    assert active_scope() is None
    seen: list[object] = []
    with dropout_scope(1, 2, 3) as outer:
        with dropout_scope(4, 5, 6) as inner:
            assert active_scope() is inner and inner.seed == 4
        assert active_scope() is outer
        th = threading.Thread(target=lambda: seen.append(active_scope()))
        th.start()
        th.join()
    assert active_scope() is None
    assert seen == [None]  # a thread must set its own scope (a contextvars.ContextVar)


@pytest.mark.parametrize(
    "kwargs,error,text",
    [
        ({"seed": -1, "step": 0, "first_sample": 0}, ValueError, "seed must be >= 0"),
        ({"seed": 0, "step": -2, "first_sample": 0}, ValueError, "step must be >= 0"),
        ({"seed": 0, "step": 0, "first_sample": 1.5}, TypeError, "first_sample must be an int"),
        ({"seed": True, "step": 0, "first_sample": 0}, TypeError, "seed must be an int"),
    ],
)
def test_scope_refuses_bad_values(kwargs: dict, error: type, text: str) -> None:
    with pytest.raises(error, match=text), dropout_scope(**kwargs):
        pass


@pytest.mark.parametrize("field", ["dropout_rate", "embedding_dropout_rate"])
@pytest.mark.parametrize("rate", [1.0, -0.1, float("nan")])
def test_config_refuses_rates_outside_0_1(field: str, rate: float) -> None:
    with pytest.raises(ValueError, match=rf"GPT2Config\.{field} must be in \[0, 1\)"):
        _cfg(**{field: rate})
    with dropout_scope(0, 0, 0), pytest.raises(ValueError, match=r"dropout rate must be in \[0, 1\)"):
        dropout_mask("transformer.drop", (1, 2, 2), rate)

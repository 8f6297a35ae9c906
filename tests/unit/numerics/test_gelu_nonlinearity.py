"""``model.nonlinearity`` as ModelZoo means it: ``gelu`` is the exact (erf) GELU, ``gelu_new`` GPT-2's tanh
form; config.json says which, so Hugging Face computes the same function. Weights of scale 1 make the two
GELUs differ in the logits (at GPT-2's init scale even the loss agrees to ~1e-6 either way)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from numpy.testing import assert_allclose

from tests.params_files import TINY
from weightstream.params import load_params, model_def
from weightstream.training.checkpoints import hf_config

torch = pytest.importorskip("torch", reason="pip install -e .[test]")
transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")


def _logits(nonlinearity: str, hf_activation: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(weightstream's logits, transformers' logits) of one random GPT-2 at weight scale 0.5."""
    raw = copy.deepcopy(TINY)
    raw["model"]["nonlinearity"] = nonlinearity
    p = load_params(raw)
    model = model_def(p)
    rng = np.random.default_rng(0)
    weights = {n: (0.5 * rng.standard_normal(s.shape)).astype(np.float32) for n, s in model.specs.items()}
    x = rng.integers(0, 64, size=(4, 16))
    ours = x
    for unit in model.units:
        ours, _ = unit.forward(weights, ours)
    config = hf_config(p)
    if hf_activation is not None:
        config["activation_function"] = hf_activation
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    hf.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()}, strict=False)
    with torch.no_grad():
        theirs = hf(torch.as_tensor(x)).logits.numpy()
    return ours, theirs


@pytest.mark.parametrize("nonlinearity", ["gelu", "gelu_new"])
def test_config_json_names_the_gelu_weightstream_computes(nonlinearity: str) -> None:
    ours, theirs = _logits(nonlinearity)
    assert_allclose(ours, theirs, rtol=0, atol=2e-5)
    assert (
        hf_config(load_params({**TINY, "model": {**TINY["model"], "nonlinearity": nonlinearity}}))[
            "activation_function"
        ]
        == nonlinearity
    )


def test_the_two_gelus_are_different_functions_here() -> None:
    """The check above can fail: with the other GELU on the Hugging Face side the losses part."""
    ours, theirs = _logits("gelu", hf_activation="gelu_new")
    assert np.abs(ours - theirs).max() > 10 * 2e-5  # ten times the tolerance the check above allows

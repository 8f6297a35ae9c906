"""ModelZoo's initialisation where a params file leaves the initializer keys out (``gpt2_model.py``, which
ModelZoo's LLaMA also is): every weight is normal(0, initializer_range) truncated at 2 std either side;
without ``initializer`` and ``output_layer_initializer`` the attention and MLP output projections take it
with std and bounds scaled by (2 num_hidden_layers)^-0.5; an untied LM head is normal(0,
initializer_range), uncut; biases 0, norms 1."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from weightstream.numerics import init_params
from weightstream.params import load_params, model_def

IR = 0.03  # initializer_range, not the 0.02 default: the test must read it
LAYERS = 3  # 2L = 6: the depth scaling 1/sqrt(6) is no other plausible factor (1/2, 1/sqrt(3))
TRUNC_STD = 0.87962566103423978  # std of N(0, 1) cut at -2 and 2

GPT2: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 4, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 4096,  # wte: 262144 draws, enough to pin the std to 0.3 %
        "hidden_size": 64,
        "num_hidden_layers": LAYERS,
        "num_heads": 4,
        "filter_size": 256,
        "max_position_embeddings": 64,
        "initializer_range": IR,
        "share_embedding_weights": False,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"max_steps": 2, "seed": 7},
}
LLAMA: dict[str, Any] = copy.deepcopy(GPT2)
LLAMA["model"].update(
    name="llama",
    filter_size=192,
    attention_module="multiquery_attention",
    extra_attention_params={"num_kv_groups": 2},
    use_projection_bias_in_attention=True,
    use_ffn_bias_in_attention=True,
    use_ffn_bias=True,
)
# (model, the embeddings, the weights that take `initializer`, the output projections) by name suffix
GROUPS = {
    "gpt2": (
        ("transformer.wte.weight", "transformer.wpe.weight"),
        ("attn.c_attn.weight", "mlp.c_fc.weight"),
        ("attn.c_proj.weight", "mlp.c_proj.weight"),
    ),
    "llama": (
        ("model.embed_tokens.weight",),
        tuple(f"{m}.weight" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")),
        ("o_proj.weight", "down_proj.weight"),
    ),
}


def _weights(model: str, **keys: Any) -> dict[str, np.ndarray]:
    raw = copy.deepcopy(GPT2 if model == "gpt2" else LLAMA)
    raw["model"].update(keys)
    return init_params(model_def(load_params(raw)), seed=7)


def _group(weights: dict[str, np.ndarray], suffixes: tuple[str, ...]) -> dict[str, np.ndarray]:
    found = {n: w for n, w in weights.items() if n.endswith(suffixes)}
    assert found, suffixes
    return found


def _pooled(group: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([w.reshape(-1) for w in group.values()]).astype(np.float64)


@pytest.mark.parametrize("model", list(GROUPS))
def test_default_is_a_normal_truncated_at_two_std(model: str) -> None:
    """Every weight lies within 2 std of 0 (and reaches near it), and the values follow the truncated
    normal itself (Kolmogorov-Smirnov against scipy's truncnorm): not an uncut normal, not another cut."""
    w = _weights(model)
    depth = 1 / math.sqrt(2 * LAYERS)
    emb, body, out = GROUPS[model]
    for suffixes, std in ((emb, IR), (body, IR), (out, IR * depth)):
        group = _group(w, suffixes)
        for name, t in group.items():
            top = np.abs(t).max()
            assert top <= np.float32(2 * std), (name, top, 2 * std)
            assert t.size < 5000 or top > 1.99 * std, (name, top)  # a large tensor reaches the cut
        pooled = _pooled(group)
        assert abs(pooled.std() / (TRUNC_STD * std) - 1) < 0.01, (suffixes, pooled.std())
        assert abs(pooled.mean()) < 5 * std / math.sqrt(pooled.size), suffixes
        p = stats.kstest(pooled, stats.truncnorm(-2, 2, scale=std).cdf).pvalue
        assert p > 1e-4, (suffixes, p)


@pytest.mark.parametrize("model", list(GROUPS))
def test_output_projections_are_narrower_by_sqrt_2L(model: str) -> None:
    """Std and bound both shrink by sqrt(2 num_hidden_layers), against the weights that take `initializer`;
    with `initializer` given they take it, unscaled; with only `output_layer_initializer` the other weights
    keep the default."""
    w = _weights(model)
    _, body, out = GROUPS[model]
    b, o = _pooled(_group(w, body)), _pooled(_group(w, out))
    assert abs(b.std() / o.std() / math.sqrt(2 * LAYERS) - 1) < 0.02
    assert abs(np.abs(b).max() / np.abs(o).max() / math.sqrt(2 * LAYERS) - 1) < 0.01
    spec = {"name": "truncated_normal", "std": IR}  # the default's own spec, given as `initializer`
    o_given = _pooled(_group(_weights(model, initializer=spec), out))
    assert abs(o_given.std() / b.std() - 1) < 0.02 and np.abs(o_given).max() > 1.99 * IR
    only_out = _weights(model, output_layer_initializer={"name": "constant", "val": 0.5})
    for name, t in _group(only_out, body).items():
        assert t.tobytes() == w[name].tobytes(), name


@pytest.mark.parametrize("model", list(GROUPS))
def test_untied_head_is_an_uncut_normal_and_the_rest_constant(model: str) -> None:
    """ModelZoo draws the untied LM head normal_(0, initializer_range) after the rest: values beyond 2 std
    exist (about 4.6 % of them), whatever the keys say; biases are 0 and norm weights 1."""
    w = _weights(model)
    head = w["lm_head.weight"].astype(np.float64)
    assert abs(head.std() / IR - 1) < 0.01
    beyond = (np.abs(head) > 2 * IR).mean()
    assert 0.04 < beyond < 0.052, beyond
    assert stats.kstest(head.reshape(-1), stats.norm(scale=IR).cdf).pvalue > 1e-4
    keyed = _weights(model, initializer="zeros", embedding_initializer="zeros")
    assert keyed["lm_head.weight"].tobytes() == w["lm_head.weight"].tobytes()
    biases = [n for n in w if n.endswith("bias")]  # the LayerNorms' too
    norms = [n for n in w if ("norm" in n or "ln_" in n) and n.endswith("weight")]
    assert biases and norms
    assert all(not w[n].any() for n in biases) and all((w[n] == 1).all() for n in norms)

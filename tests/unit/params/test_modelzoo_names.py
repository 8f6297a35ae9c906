"""ModelZoo's ``sparsity.param_filter`` globs over ModelZoo's module names select the same tensors here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from weightstream.params import ParamsError, load_params, model_def
from weightstream.params.modelzoo_names import modelzoo_names
from weightstream.params.schema import Params
from weightstream.params.sparsity import filter_selection, sparsity_specs

# ModelZoo's GPT-3 static sparsity (configs/sparsity/pretraining/params_gpt3_125m_static75.yaml)
GPT3_STATIC75 = ["*proj_[qkv]_dense_layer.weight", "*proj_output_dense_layer.weight", "*linear_layer.weight"]

GPT3: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 4, "max_sequence_length": 16},
    "model": {
        "name": "gpt3",
        "vocab_size": 256,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 128,
        "max_position_embeddings": 16,
        "share_embedding_weights": True,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"max_steps": 1},
}

LLAMA: dict[str, Any] = {
    **GPT3,
    "model": {
        "name": "llama",
        "vocab_size": 256,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 96,
        "max_position_embeddings": 16,
        "position_embedding_type": "rotary",
        "norm_type": "rmsnorm",
        "nonlinearity": "swiglu",
        "share_embedding_weights": False,
    },
}

FC_MLP: dict[str, Any] = {
    **GPT3,
    "train_input": {"data_processor": "DigitsDataProcessor", "batch_size": 4},
    "model": {"name": "fc_mlp", "input_size": 64, "hidden_size": 16, "depth": 2},
}


def _params(base: dict[str, Any], sparsity: dict[str, Any] | None, **model: Any) -> Params:
    raw = copy.deepcopy(base)
    raw["model"].update(model)
    if sparsity is not None:
        raw["sparsity"] = sparsity
    return load_params(raw)


def _problem(base: dict[str, Any], sparsity: dict[str, Any]) -> tuple[str, str]:
    """(path, message) of the one problem loading ``base`` with this sparsity block raises."""
    with pytest.raises(ParamsError) as e:
        _params(base, sparsity)
    assert len(e.value.problems) == 1, e.value.problems
    return e.value.problems[0].path, str(e.value.problems[0])


def _block(layer: int, *parts: str, prefix: str = "transformer.h") -> list[str]:
    return [f"{prefix}.{layer}.{part}.weight" for part in parts]


GPT2_LINEAR = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


# -------------------------------------------------------------------------------------------- the names
@pytest.mark.parametrize(
    ("base", "model"),
    [
        (GPT3, {}),
        (GPT3, {"share_embedding_weights": False}),
        (LLAMA, {}),
        (LLAMA, {"use_projection_bias_in_attention": True, "use_ffn_bias_in_attention": True}),
        (LLAMA, {"use_ffn_bias": True, "share_embedding_weights": True}),
        (FC_MLP, {}),
    ],
)
def test_every_tensor_has_its_own_modelzoo_names(base: dict[str, Any], model: dict[str, Any]) -> None:
    """Each of our tensors has ModelZoo name(s), all under ``model.`` (ModelZoo's model wrapper holds the
    network as ``self.model``), and no two tensors claim the same ModelZoo name."""
    names = modelzoo_names(model_def(_params(base, None, **model)))
    assert all(names.values()), [n for n, mz in names.items() if not mz]
    flat = [m for mz in names.values() for m in mz]
    assert len(flat) == len(set(flat))
    assert all(m.startswith("model.") for m in flat)


def test_names_follow_modelzoos_checkpoint_converters() -> None:
    """Spot checks against gpt2_hf_cs.py and llama.py (Release 2.10, CS 2.1+ layout)."""
    gpt = modelzoo_names(model_def(_params(GPT3, None, share_embedding_weights=False)))
    layer = "model.transformer_decoder.layers.1."
    assert gpt["transformer.h.1.attn.c_attn.weight"] == tuple(
        layer + f"self_attn.proj_{x}_dense_layer.weight" for x in "qkv"
    )
    assert gpt["transformer.h.1.attn.c_attn.bias"] == tuple(
        layer + f"self_attn.proj_{x}_dense_layer.bias" for x in "qkv"
    )
    assert gpt["transformer.h.1.attn.c_proj.bias"] == (layer + "self_attn.proj_output_dense_layer.bias",)
    assert gpt["transformer.h.1.mlp.c_fc.weight"] == (layer + "ffn.ffn.0.linear_layer.weight",)
    assert gpt["transformer.h.1.mlp.c_proj.weight"] == (layer + "ffn.ffn.1.linear_layer.weight",)
    assert gpt["transformer.h.1.ln_1.bias"] == (layer + "norm1.bias",)
    assert gpt["transformer.h.1.ln_2.weight"] == (layer + "norm3.weight",)
    assert gpt["transformer.wte.weight"] == ("model.embedding_layer.word_embeddings.weight",)
    assert gpt["transformer.wpe.weight"] == ("model.embedding_layer.position_embeddings.embed.weight",)
    assert gpt["transformer.ln_f.weight"] == ("model.ln_f.weight",)
    assert gpt["lm_head.weight"] == ("model.lm_head.weight",)
    llama = modelzoo_names(model_def(_params(LLAMA, None)))
    ours = "model.layers.1."
    assert llama[ours + "self_attn.q_proj.weight"] == (layer + "self_attn.proj_q_dense_layer.weight",)
    assert llama[ours + "self_attn.k_proj.weight"] == (layer + "self_attn.proj_k_dense_layer.weight",)
    assert llama[ours + "self_attn.v_proj.weight"] == (layer + "self_attn.proj_v_dense_layer.weight",)
    assert llama[ours + "self_attn.o_proj.weight"] == (layer + "self_attn.proj_output_dense_layer.weight",)
    assert llama[ours + "mlp.up_proj.weight"] == (layer + "ffn.ffn.0.linear_layer.weight",)
    assert llama[ours + "mlp.gate_proj.weight"] == (layer + "ffn.ffn.0.linear_layer_for_glu.weight",)
    assert llama[ours + "mlp.down_proj.weight"] == (layer + "ffn.ffn.1.linear_layer.weight",)
    assert llama[ours + "input_layernorm.weight"] == (layer + "norm1.weight",)
    assert llama[ours + "post_attention_layernorm.weight"] == (layer + "norm3.weight",)
    assert llama["model.norm.weight"] == ("model.ln_f.weight",)
    assert llama["model.embed_tokens.weight"] == ("model.embedding_layer.word_embeddings.weight",)
    mlp = modelzoo_names(model_def(_params(FC_MLP, None)))
    assert mlp["fc.1.weight"] == ("model.fc_layers.1.weight",)
    assert mlp["head.bias"] == ("model.last_layer.bias",)


# ------------------------------------------------------------------------------ ModelZoo's own filters
@pytest.mark.parametrize("model", [{}, {"share_embedding_weights": False}])
def test_gpt3_static75_filter_selects_every_linear_weight_of_the_blocks(model: dict[str, Any]) -> None:
    """Exactly c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj of each block, at 0.75: not the embeddings,
    the untied LM head, norms or biases."""
    p = _params(GPT3, {"sparsity": 0.75, "param_filter": GPT3_STATIC75}, **model)
    specs = sparsity_specs(p, model_def(p))
    assert list(specs) == _block(0, *GPT2_LINEAR) + _block(1, *GPT2_LINEAR)
    assert {s.sparsity for s in specs.values()} == {0.75}


def test_gpt3_filter_on_llama_leaves_the_gate_dense_as_modelzoo_does() -> None:
    """ModelZoo's ``*linear_layer.weight`` matches up_proj (``ffn.ffn.0.linear_layer``) and down_proj but
    not the gate (``ffn.ffn.0.linear_layer_for_glu``): globs match the whole name there too."""
    p = _params(LLAMA, {"sparsity": 0.75, "param_filter": GPT3_STATIC75})
    attn_and = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    no_gate = ("mlp.up_proj", "mlp.down_proj")
    want = [n for i in (0, 1) for n in _block(i, *attn_and, *no_gate, prefix="model.layers")]
    assert sorted(sparsity_specs(p, model_def(p))) == sorted(want)


@pytest.mark.parametrize(
    "glu_filter",
    [
        [*GPT3_STATIC75, "*linear_layer_for_glu.weight"],
        ["*proj_*_dense_layer.weight", "*linear_layer*.weight"],
    ],
)
def test_modelzoo_filters_select_every_llama_projection(glu_filter: list[str]) -> None:
    p = _params(LLAMA, {"sparsity": 0.9, "param_filter": glu_filter})
    model = model_def(p)
    assert list(sparsity_specs(p, model)) == list(model.sparse_candidates)
    assert len(model.sparse_candidates) == 2 * 7  # q, k, v, o, gate, up, down per layer; not lm_head


def test_full_modelzoo_names_select_one_layer() -> None:
    """A glob over the whole ModelZoo name, ``model.`` prefix included, picks out layer 1."""
    p = _params(GPT3, {"sparsity": 0.5, "param_filter": "model.transformer_decoder.layers.1.*.weight"})
    assert list(sparsity_specs(p, model_def(p))) == _block(1, *GPT2_LINEAR)


def test_fc_mlp_modelzoo_names() -> None:
    p = _params(FC_MLP, {"sparsity": 0.5, "param_filter": ["model.fc_layers.*.weight"]})
    assert list(sparsity_specs(p, model_def(p))) == ["fc.0.weight", "fc.1.weight"]


def test_per_glob_levels_over_modelzoo_names() -> None:
    """The mapping form of ``sparsity.sparsity``: each tensor takes the first ModelZoo glob matching it."""
    levels = {"*proj_[qkv]_dense_layer.weight": 0.9, "*ffn.ffn.1.*": 0.8, "*linear_layer.weight": 0.5}
    p = _params(GPT3, {"sparsity": levels})
    got = {n: s.sparsity for n, s in sparsity_specs(p, model_def(p)).items()}
    want: dict[str, float] = {}
    for i in (0, 1):
        want |= {f"transformer.h.{i}.attn.c_attn.weight": 0.9, f"transformer.h.{i}.mlp.c_fc.weight": 0.5}
        want |= {f"transformer.h.{i}.mlp.c_proj.weight": 0.8}
    assert got == want


# ------------------------------------------------------------------------------- the fused c_attn error
@pytest.mark.parametrize(
    ("sparsity", "path"),
    [
        (
            {"sparsity": 0.5, "param_filter": ["*.mlp.*", "*proj_q_dense_layer.weight"]},
            "sparsity.param_filter[1]",
        ),
        ({"sparsity": 0.5, "param_filter": "*proj_[qk]_dense_layer.weight"}, "sparsity.param_filter"),
        ({"sparsity": 0.5, "param_filter": ["*layers.0.self_attn.proj_[vo]*"]}, "sparsity.param_filter[0]"),
        (
            {"sparsity": {"*proj_q_dense_layer.weight": 0.9}},
            "sparsity.sparsity['*proj_q_dense_layer.weight']",
        ),
        (
            {"sparsity": {"*.mlp.*": 0.9, "*proj_v_dense_layer.weight": 0.5}, "param_filter": GPT3_STATIC75},
            "sparsity.sparsity['*proj_v_dense_layer.weight']",
        ),
    ],
)
def test_part_of_gpt2s_fused_qkv_is_an_error_naming_the_glob(sparsity: dict[str, Any], path: str) -> None:
    got_path, message = _problem(GPT3, sparsity)
    assert got_path == path
    assert "q, k and v are one tensor in weightstream's GPT-2" in message
    assert "'transformer.h.0.attn.c_attn.weight'" in message


def test_the_same_glob_is_one_projection_in_llama() -> None:
    p = _params(LLAMA, {"sparsity": 0.5, "param_filter": "*proj_q_dense_layer.weight"})
    want = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    assert list(sparsity_specs(p, model_def(p))) == want


def test_a_third_of_the_fused_bias_is_no_fused_error() -> None:
    """Biases stay dense whatever selects them, so a glob on q's bias is the 'cannot be sparse' error."""
    path, message = _problem(GPT3, {"sparsity": 0.5, "param_filter": ["*proj_q_dense_layer.bias"]})
    assert path == "sparsity.param_filter[0]"
    assert "cannot be sparse" in message
    assert "c_attn.bias" in message


@pytest.mark.parametrize(
    ("sparsity", "path", "words"),
    [
        (
            {"sparsity": 0.5, "param_filter": ["*word_embeddings*"]},
            "sparsity.param_filter[0]",
            "cannot be sparse",
        ),
        (
            {"sparsity": 0.5, "param_filter": "*proj_z_dense_layer.weight"},
            "sparsity.param_filter",
            "matches no",
        ),
        (
            {"sparsity": {"*linear_layer_for_glu.weight": 0.5}},
            "sparsity.sparsity['*linear_layer_for_glu.weight']",
            "matches no",
        ),
    ],
)
def test_modelzoo_globs_selecting_nothing_stay_errors(
    sparsity: dict[str, Any], path: str, words: str
) -> None:
    got_path, message = _problem(GPT3, sparsity)
    assert (got_path, words in message) == (path, True)


# ------------------------------------------------------------------------------- Hugging Face names
def _levels(level: float, layers: tuple[int, ...], *parts: str) -> dict[str, float]:
    return {n: level for i in layers for n in _block(i, *parts)}


@pytest.mark.parametrize(
    ("sparsity", "want"),
    [
        ({"sparsity": 0.9, "param_filter": ["*.mlp.*"]}, _levels(0.9, (0, 1), "mlp.c_fc", "mlp.c_proj")),
        (
            {"sparsity": 0.9, "param_filter": "transformer.h.1.attn.c_attn.weight"},
            _levels(0.9, (1,), "attn.c_attn"),
        ),
        (
            {"sparsity": 0.9, "param_filter": ["*.c_proj.weight", "*.h.0.*"]},
            _levels(0.9, (0,), *GPT2_LINEAR) | _levels(0.9, (1,), "attn.c_proj", "mlp.c_proj"),
        ),
        (
            {"sparsity": {"*.mlp.*": 0.95, "*.attn.*": 0.75}},
            _levels(0.75, (0, 1), "attn.c_attn", "attn.c_proj")
            | _levels(0.95, (0, 1), "mlp.c_fc", "mlp.c_proj"),
        ),
        (
            {"sparsity": {"*.c_fc.*": 0.5}, "param_filter": ["*.mlp.*", "*.c_attn.weight"]},
            _levels(0.5, (0, 1), "mlp.c_fc"),
        ),
    ],
)
def test_hugging_face_globs_select_what_they_always_did(
    sparsity: dict[str, Any], want: dict[str, float]
) -> None:
    p = _params(GPT3, sparsity)
    specs = sparsity_specs(p, model_def(p))
    assert {n: s.sparsity for n, s in specs.items()} == want
    assert list(specs) == sorted(want, key=list(model_def(p).specs).index)  # the model's order


# ----------------------------------------------------------------------------------------- the listing
def test_filter_selection_lists_each_glob_and_its_tensors() -> None:
    filt = [*GPT3_STATIC75, "*.h.1.*"]  # the last glob also hits layer 1's biases and norms: not listed
    p = _params(GPT3, {"sparsity": 0.75, "param_filter": filt})
    assert filter_selection(p, model_def(p)) == [
        (filt[0], _block(0, "attn.c_attn") + _block(1, "attn.c_attn")),
        (filt[1], _block(0, "attn.c_proj") + _block(1, "attn.c_proj")),
        (filt[2], _block(0, "mlp.c_fc", "mlp.c_proj") + _block(1, "mlp.c_fc", "mlp.c_proj")),
        (filt[3], _block(1, *GPT2_LINEAR)),  # selected again: listed under both globs
    ]


def test_filter_selection_is_empty_without_a_filter() -> None:
    for sparsity in (None, {"sparsity": 0.5}, {"sparsity": {"*proj_[qkv]_dense_layer.weight": 0.5}}):
        p = _params(GPT3, sparsity)
        assert filter_selection(p, model_def(p)) == []

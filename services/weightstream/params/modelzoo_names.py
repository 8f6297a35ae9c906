"""ModelZoo's names for our tensors, so a ModelZoo ``sparsity.param_filter`` selects what it selects there.

weightstream names tensors as Hugging Face does (``transformer.h.0.attn.c_attn.weight``); ModelZoo's
params files select weights with globs over its own module names, as ``named_parameters()`` of its
model (``Gpt2Model`` / ``LlamaModel`` / ``MNISTModel``, whose network is the attribute ``model``) yields
them: ``model.transformer_decoder.layers.0.self_attn.proj_q_dense_layer.weight``. The tables below follow
ModelZoo's Hugging Face <-> CS checkpoint converters (``tools/checkpoint_converters/gpt2_hf_cs.py``,
``llama.py``, Release 2.10, CS 2.1+ layout).

One of our tensors may hold several ModelZoo parameters: GPT-2's ``c_attn`` is q, k and v fused into one
[C, 3C] tensor, which ModelZoo keeps as three ``nn.Linear`` layers ``proj_{q,k,v}_dense_layer`` ([C, C]
each, [out, in]: transposed against our Conv1D layout; for choosing which tensors are sparse only the
names matter). Every other tensor is one ModelZoo parameter.

ModelZoo's final norm is one module under two attributes (``ln_f`` and ``transformer_decoder.norm``);
``named_parameters()`` yields it once, under ``ln_f`` (registered first), and so does this table. A tied
LM head is likewise yielded once, as the word embeddings (our tied models have no ``lm_head`` tensor).
"""

from __future__ import annotations

import re

from weightstream.numerics import ModelDef

__all__ = ["fused_why", "modelzoo_names"]

_LAYER = "model.transformer_decoder.layers.{0}."

# (pattern over our name, ModelZoo names it holds; {0} is the layer index, {1} weight/bias), per family
_RULES: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "gpt2": [
        (r"transformer\.wte\.weight", ("model.embedding_layer.word_embeddings.weight",)),
        # CS 2.1 moved learned positions into their own layer (converter CS20_CS21)
        (r"transformer\.wpe\.weight", ("model.embedding_layer.position_embeddings.embed.weight",)),
        (r"transformer\.h\.(\d+)\.ln_1\.(weight|bias)", (_LAYER + "norm1.{1}",)),
        (r"transformer\.h\.(\d+)\.ln_2\.(weight|bias)", (_LAYER + "norm3.{1}",)),
        (
            r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)",
            tuple(_LAYER + f"self_attn.proj_{x}_dense_layer.{{1}}" for x in "qkv"),
        ),
        (
            r"transformer\.h\.(\d+)\.attn\.c_proj\.(weight|bias)",
            (_LAYER + "self_attn.proj_output_dense_layer.{1}",),
        ),
        (r"transformer\.h\.(\d+)\.mlp\.c_fc\.(weight|bias)", (_LAYER + "ffn.ffn.0.linear_layer.{1}",)),
        (r"transformer\.h\.(\d+)\.mlp\.c_proj\.(weight|bias)", (_LAYER + "ffn.ffn.1.linear_layer.{1}",)),
        (r"transformer\.ln_f\.(weight|bias)", ("model.ln_f.{0}",)),
        (r"lm_head\.weight", ("model.lm_head.weight",)),
    ],
    "llama": [
        (r"model\.embed_tokens\.weight", ("model.embedding_layer.word_embeddings.weight",)),
        (
            r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)",
            (_LAYER + "self_attn.proj_q_dense_layer.{1}",),
        ),
        (
            r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)",
            (_LAYER + "self_attn.proj_k_dense_layer.{1}",),
        ),
        (
            r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)",
            (_LAYER + "self_attn.proj_v_dense_layer.{1}",),
        ),
        (
            r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)",
            (_LAYER + "self_attn.proj_output_dense_layer.{1}",),
        ),
        # ModelZoo's GLU layer: linear_layer is up_proj, linear_layer_for_glu the gate (converter llama.py)
        (r"model\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)", (_LAYER + "ffn.ffn.0.linear_layer.{1}",)),
        (
            r"model\.layers\.(\d+)\.mlp\.gate_proj\.(weight|bias)",
            (_LAYER + "ffn.ffn.0.linear_layer_for_glu.{1}",),
        ),
        (r"model\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)", (_LAYER + "ffn.ffn.1.linear_layer.{1}",)),
        (r"model\.layers\.(\d+)\.input_layernorm\.(weight)", (_LAYER + "norm1.{1}",)),
        (r"model\.layers\.(\d+)\.post_attention_layernorm\.(weight)", (_LAYER + "norm3.{1}",)),
        (r"model\.norm\.(weight)", ("model.ln_f.{0}",)),
        (r"lm_head\.weight", ("model.lm_head.weight",)),
    ],
    # fc_mlp is ModelZoo's fc_mnist (MNISTModel: fc_layers, last_layer)
    "fc_mlp": [
        (r"fc\.(\d+)\.(weight|bias)", ("model.fc_layers.{0}.{1}",)),
        (r"head\.(weight|bias)", ("model.last_layer.{0}",)),
    ],
}

# why a tensor holding several ModelZoo parameters takes them together, by our tensor's name
_FUSED_WHY = (
    (
        re.compile(r".*\.attn\.c_attn\.(weight|bias)"),
        "q, k and v are one tensor in weightstream's GPT-2 (Hugging Face's fused c_attn, [C, 3C]), sparse "
        "as a whole or not at all: select all three (e.g. '*proj_[qkv]_dense_layer.weight') or none",
    ),
)


def modelzoo_names(model: ModelDef) -> dict[str, tuple[str, ...]]:
    """{our tensor name: the ModelZoo parameter names it holds}, in the model's tensor order. Several names
    mean one fused tensor (GPT-2's c_attn: q, k, v); a tensor of a family without a table maps to ()."""
    rules = [(re.compile(pattern), names) for pattern, names in _RULES.get(model.family, [])]
    out: dict[str, tuple[str, ...]] = {}
    for n in model.specs:
        out[n] = ()
        for pattern, names in rules:
            m = pattern.fullmatch(n)
            if m:
                out[n] = tuple(name.format(*m.groups()) for name in names)
                break
    return out


def fused_why(tensor: str) -> str:
    """Why the ModelZoo parameters that our ``tensor`` holds are selected together, for error messages."""
    for pattern, why in _FUSED_WHY:
        if pattern.fullmatch(tensor):
            return why
    return (
        "weightstream holds them in one tensor, sparse as a whole or not at all: select all of them or none"
    )

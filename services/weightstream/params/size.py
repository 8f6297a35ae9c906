"""How big a job is, from its params alone: parameters, layers, tokens per step.

Computed in closed form with Python integers, never by building the model: ``model_def`` makes one
``ParamSpec`` per tensor (12 per GPT-2 layer), so asking it how big ``num_hidden_layers: 1000000000`` is
would itself exhaust memory. ``tests/unit/jobs/test_limits.py`` checks these formulas against
``model_def(...).num_params``.
"""

from __future__ import annotations

from weightstream.params.schema import (
    FCMLPModelParams,
    GPT2ModelParams,
    InputParams,
    LanguageModelParams,
    LlamaModelParams,
)

__all__ = ["num_layers", "num_params", "tokens_per_step"]

ModelParams = GPT2ModelParams | LlamaModelParams | FCMLPModelParams


def num_params(m: ModelParams) -> int:
    """Trainable parameters of the model (float32 numbers; optimizer state comes on top)."""
    if isinstance(m, GPT2ModelParams):
        c, f = m.hidden_size, m.inner_size
        # ln_1 + ln_2 (4c), c_attn (3c^2 + 3c), attn c_proj (c^2 + c), c_fc (cf + f), mlp c_proj (fc + c)
        block = 4 * c * c + 2 * c * f + 9 * c + f
        embeddings = m.vocab_size * c * (1 if m.share_embedding_weights else 2)  # wte (+ an untied head)
        return embeddings + m.max_position_embeddings * c + m.num_hidden_layers * block + 2 * c  # + ln_f
    if isinstance(m, LlamaModelParams):
        c, f, kv = m.hidden_size, m.inner_size, m.num_kv_heads * m.head_dim
        # two RMSNorms (2c), q and o (2c^2), k and v (2 kv c), gate, up and down (3cf), optional biases
        block = 2 * c + 2 * c * c + 2 * kv * c + 3 * c * f
        block += (2 * c + 2 * kv) * m.use_projection_bias_in_attention + (2 * f + c) * m.use_ffn_bias
        embeddings = m.vocab_size * c * (1 if m.share_embedding_weights else 2)
        return embeddings + m.num_hidden_layers * block + c  # + the final norm
    i, h, k = m.input_size, m.hidden_size, m.num_classes
    # input -> hidden, (depth - 1) x hidden -> hidden, hidden -> classes; each a weight and a bias
    return (i * h + h) + (m.depth - 1) * (h * h + h) + (h * k + k)


def num_layers(m: ModelParams) -> int:
    """Hidden layers: what the model's streamable units (and its list of tensors) grow with."""
    return m.num_hidden_layers if isinstance(m, LanguageModelParams) else m.depth


def tokens_per_step(inp: InputParams, m: ModelParams) -> int:
    """Tokens one step of ``inp`` trains on (samples for fc_mlp, which has no sequence)."""
    if isinstance(m, LanguageModelParams):
        return inp.batch_size * (inp.max_sequence_length or 1)
    return inp.batch_size

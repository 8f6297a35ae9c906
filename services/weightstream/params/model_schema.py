"""The ``model:`` section: one pydantic model per model family (``name`` picks it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
)

from weightstream.params.section import Section, ZeroDropout


class _LanguageModelParams(Section):
    """What every decoder-only language model shares: sizes, vocabulary, positions, initialisation."""

    name: str
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_heads: PositiveInt
    filter_size: PositiveInt | None = None  # the MLP's inner size
    max_position_embeddings: PositiveInt
    layer_norm_epsilon: PositiveFloat = 1e-5
    initializer_range: PositiveFloat = 0.02
    attention_dropout_rate: ZeroDropout = 0.0
    attention_type: Literal["scaled_dot_product"] = "scaled_dot_product"
    loss_scaling: Literal["num_tokens"] = "num_tokens"
    fp16_type: Literal["bfloat16"] | None = None  # bf16 on the wire; the master copy stays fp32

    @property
    def inner_size(self) -> int:
        return self.filter_size if self.filter_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class GPT2ModelParams(_LanguageModelParams):
    name: Literal["gpt2", "gpt3"]  # ModelZoo's GPT-3 is GPT-2's architecture (learned positions, LayerNorm)
    position_embedding_type: Literal["learned"] = "learned"
    share_embedding_weights: bool = True
    # ModelZoo's meaning: gelu is the exact (erf) GELU, gelu_new the tanh form (Hugging Face GPT-2's)
    nonlinearity: Literal["gelu", "gelu_new"] = "gelu"
    # Hugging Face's resid_pdrop (after each projection, before its residual add) and embd_pdrop
    dropout_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    embedding_dropout_rate: Annotated[float, Field(ge=0, lt=1)] | None = None  # None: dropout_rate
    norm_type: Literal["layernorm"] = "layernorm"
    use_projection_bias_in_attention: Literal[True] = True
    use_ffn_bias_in_attention: Literal[True] = True
    use_ffn_bias: Literal[True] = True
    use_bias_in_output: Literal[False] = False

    @property
    def embedding_dropout(self) -> float:
        """``embedding_dropout_rate``, or ``dropout_rate`` where it is left out (ModelZoo's default)."""
        return self.dropout_rate if self.embedding_dropout_rate is None else self.embedding_dropout_rate


class ExtraAttentionParams(Section):
    num_kv_groups: PositiveInt  # key/value heads of grouped-query attention


class LlamaModelParams(_LanguageModelParams):
    """ModelZoo's ``name: llama`` keys, as Hugging Face's ``LlamaForCausalLM`` implements them."""

    name: Literal["llama"]
    filter_size: PositiveInt  # SwiGLU's inner size (intermediate_size); no default, as in ModelZoo
    position_embedding_type: Literal["rotary"] = "rotary"
    rope_theta: PositiveFloat = 10000.0
    rotary_dim: PositiveInt | None = None  # None: the whole head (Hugging Face's LLaMA rotates all of it)
    norm_type: Literal["rmsnorm"] = "rmsnorm"
    nonlinearity: Literal["swiglu"] = "swiglu"
    share_embedding_weights: bool = False
    # Hugging Face's attention_bias puts a bias on q, k, v and o alike: the two keys must agree
    use_projection_bias_in_attention: bool = False  # q, k, v
    use_ffn_bias_in_attention: bool = False  # o
    use_ffn_bias: bool = False  # gate, up, down (mlp_bias)
    use_bias_in_output: Literal[False] = False  # LlamaForCausalLM's head has no bias
    # multiquery_attention with extra_attention_params.num_kv_groups: grouped-query attention
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = "aiayn_attention"
    extra_attention_params: ExtraAttentionParams | None = None
    dropout_rate: ZeroDropout = 0.0
    embedding_dropout_rate: ZeroDropout = 0.0

    @property
    def num_kv_heads(self) -> int:
        if self.attention_module == "aiayn_attention":
            return self.num_heads
        return self.extra_attention_params.num_kv_groups if self.extra_attention_params else 1


LanguageModelParams = GPT2ModelParams | LlamaModelParams


class FCMLPModelParams(Section):
    name: Literal["fc_mlp"]
    input_size: PositiveInt
    hidden_size: PositiveInt
    depth: PositiveInt  # number of hidden layers
    num_classes: PositiveInt = 10
    activation_fn: Literal["relu"] = "relu"
    dropout: ZeroDropout = 0.0
    fp16_type: Literal["bfloat16"] | None = None

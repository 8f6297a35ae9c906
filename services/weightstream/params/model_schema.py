"""The ``model:`` section: one pydantic model per model family (``name`` picks it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
)

from weightstream.numerics.rope_scaling import make_rope_scaling
from weightstream.params.initializer_schema import InitializerParams
from weightstream.params.section import HalfType, Section, ZeroDropout, only_zero

__all__ = [
    "ExtraAttentionParams",
    "FCMLPModelParams",
    "GPT2ModelParams",
    "LanguageModelParams",
    "LlamaModelParams",
]


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
    # ModelZoo's initializer specs (initializer_schema.py). initializer: q, k, v and the MLP's first
    # layer(s); output_layer_initializer: the attention output and the MLP's last layer (left out: these
    # take initializer); embedding_initializer: the token (and learned position) embeddings. Left out:
    # ModelZoo's default: normal(0, initializer_range) cut at 2 std, the output projections' (without
    # either key) scaled by 1/sqrt(2 num_hidden_layers), gpt2 and llama alike (numerics/model.py)
    initializer: InitializerParams | None = None
    embedding_initializer: InitializerParams | None = None
    output_layer_initializer: InitializerParams | None = None
    attention_type: Literal["scaled_dot_product"] = "scaled_dot_product"
    # ModelZoo's GPTLMHeadModelLoss: num_tokens divides the summed token losses by the counted (not padding)
    # tokens, batch_size by the batch size and multiplies by loss_weight (see data/loss_scaling.py)
    loss_scaling: Literal["num_tokens", "batch_size"] = "num_tokens"
    loss_weight: PositiveFloat = 1.0
    fp16_type: HalfType | None = None  # bf16 on the wire; the master copy stays fp32

    @field_validator("loss_weight")
    @classmethod
    def _weight_needs_batch_size(cls, v: float, info: ValidationInfo) -> float:
        if v != 1.0 and info.data.get("loss_scaling") == "num_tokens":  # absent: it failed itself
            raise ValueError(
                "must be 1.0 with loss_scaling: num_tokens (as in ModelZoo); a weight applies to "
                "loss_scaling: batch_size, usually 1 / max_sequence_length"
            )
        return v

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
    # Hugging Face's attn_pdrop: on the attention probabilities. None: dropout_rate, as in ModelZoo; left
    # out: 0.0 (ModelZoo's default is 0.1; 0.0 keeps what a params file without the key trained before)
    attention_dropout_rate: Annotated[float, Field(ge=0, lt=1)] | None = 0.0
    norm_type: Literal["layernorm"] = "layernorm"
    use_projection_bias_in_attention: Literal[True] = True
    use_ffn_bias_in_attention: Literal[True] = True
    use_ffn_bias: Literal[True] = True
    use_bias_in_output: Literal[False] = False

    @property
    def embedding_dropout(self) -> float:
        """``embedding_dropout_rate``, or ``dropout_rate`` where it is left out (ModelZoo's default)."""
        return self.dropout_rate if self.embedding_dropout_rate is None else self.embedding_dropout_rate

    @property
    def attention_dropout(self) -> float:
        """``attention_dropout_rate``, or ``dropout_rate`` where it is null (ModelZoo's meaning)."""
        return self.dropout_rate if self.attention_dropout_rate is None else self.attention_dropout_rate


class ExtraAttentionParams(Section):
    num_kv_groups: PositiveInt  # key/value heads of grouped-query attention


LlamaNoDropout = only_zero(
    "must be 0.0 for llama: weightstream implements attention dropout for gpt2/gpt3 only "
    "(Hugging Face's LlamaForCausalLM attention_dropout is not implemented)"
)


class LlamaModelParams(_LanguageModelParams):
    """ModelZoo's ``name: llama`` keys, as Hugging Face's ``LlamaForCausalLM`` implements them."""

    name: Literal["llama"]
    filter_size: PositiveInt  # SwiGLU's inner size (intermediate_size); no default, as in ModelZoo
    position_embedding_type: Literal["rotary"] = "rotary"
    rope_theta: PositiveFloat = 10000.0
    rotary_dim: PositiveInt | None = None  # None: the whole head (Hugging Face's LLaMA rotates all of it)
    # RoPE scaling, as Hugging Face's rope_parameters (numerics/rope_scaling.py): linear divides every
    # frequency by the factor, llama3 (Llama 3.1) only the low ones, with its three pos_scaling_extra_args
    pos_scaling_type: Literal["linear", "llama3"] = "linear"
    pos_scaling_factor: PositiveFloat = 1.0  # linear by 1.0: no scaling
    pos_scaling_extra_args: dict[str, float | int] | None = Field(default=None, validate_default=True)
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
    attention_dropout_rate: LlamaNoDropout = 0.0

    @field_validator("pos_scaling_type", mode="before")
    @classmethod
    def _implemented_scaling(cls, v: object) -> object:
        if isinstance(v, str) and v.lower() in ("yarn", "longrope"):  # ModelZoo's other two
            raise ValueError(
                f"{v} RoPE scaling is not implemented (it rescales frequencies per band and the attention's "
                "cos/sin as well); weightstream implements linear and llama3"
            )
        return v

    @field_validator("pos_scaling_extra_args")
    @classmethod
    def _args_of_the_type(
        cls, v: dict[str, float | int] | None, info: ValidationInfo
    ) -> dict[str, float | int] | None:
        kind, factor = info.data.get("pos_scaling_type"), info.data.get("pos_scaling_factor")
        if kind is not None and factor is not None:  # absent: it failed itself
            make_rope_scaling(kind, factor, v)  # ValueError naming a key the type lacks or does not take
        return v

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
    fp16_type: HalfType | None = None

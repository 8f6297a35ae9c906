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

    name: str = Field(description="the model family")
    vocab_size: PositiveInt = Field(description="tokens in the vocabulary (ids 0 to vocab_size - 1)")
    hidden_size: PositiveInt = Field(description="the width of the residual stream")
    num_hidden_layers: PositiveInt = Field(description="transformer blocks")
    num_heads: PositiveInt = Field(description="attention heads (hidden_size / num_heads each)")
    filter_size: PositiveInt | None = Field(None, description="the MLP's inner size; null: 4 * hidden_size")
    max_position_embeddings: PositiveInt = Field(description="the longest sequence the model takes")
    layer_norm_epsilon: PositiveFloat = Field(1e-5, description="the epsilon of every normalisation")
    initializer_range: PositiveFloat = Field(
        0.02, description="the std of the default initialisation (a normal cut at 2 std)"
    )
    # ModelZoo's initializer specs (initializer_schema.py). initializer: q, k, v and the MLP's first
    # layer(s); output_layer_initializer: the attention output and the MLP's last layer (left out: these
    # take initializer); embedding_initializer: the token (and learned position) embeddings. Left out:
    # ModelZoo's default: normal(0, initializer_range) cut at 2 std, the output projections' (without
    # either key) scaled by 1/sqrt(2 num_hidden_layers), gpt2 and llama alike (numerics/model.py)
    initializer: InitializerParams | None = Field(
        None, description="q, k, v and the MLP's first layer(s); null: the default initialisation"
    )
    embedding_initializer: InitializerParams | None = Field(
        None, description="the token (and learned position) embeddings; null: the default initialisation"
    )
    output_layer_initializer: InitializerParams | None = Field(
        None,
        description="the attention output and the MLP's last layer; null: initializer if given, else the "
        "default scaled by 1/sqrt(2 num_hidden_layers)",
    )
    attention_type: Literal["scaled_dot_product"] = Field(
        "scaled_dot_product", description="softmax(q k^T / sqrt(head size)) v"
    )
    # ModelZoo's GPTLMHeadModelLoss (see data/loss_scaling.py)
    loss_scaling: Literal["num_tokens", "batch_size"] = Field(
        "num_tokens",
        description="num_tokens divides the summed token losses by the counted (not padding) tokens, "
        "batch_size by the batch size and multiplies by loss_weight",
    )
    loss_weight: PositiveFloat = Field(
        1.0, description="with loss_scaling: batch_size, usually 1 / max_sequence_length; else 1.0"
    )
    fp16_type: HalfType | None = Field(
        None,
        description="bfloat16 on the wire (cbfloat16 runs as bfloat16); the master copy stays fp32; "
        "null: fp32 throughout",
    )

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
    """ModelZoo's ``name: gpt2`` and ``name: gpt3`` keys, as Hugging Face's ``GPT2LMHeadModel`` implements
    them (ModelZoo's GPT-3 is GPT-2's architecture: learned positions, LayerNorm)."""

    name: Literal["gpt2", "gpt3"] = Field(description="the model family")
    position_embedding_type: Literal["learned"] = Field("learned", description="learned position embeddings")
    share_embedding_weights: bool = Field(True, description="the LM head is the token embeddings (tied)")
    # ModelZoo's meaning of the two names
    nonlinearity: Literal["gelu", "gelu_new"] = Field(
        "gelu", description="gelu: the exact (erf) GELU; gelu_new: the tanh form (Hugging Face GPT-2's)"
    )
    dropout_rate: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="dropout after each projection, before its residual add (Hugging Face's resid_pdrop)",
    )
    embedding_dropout_rate: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None, description="dropout on the embeddings (Hugging Face's embd_pdrop); null: dropout_rate"
    )
    # ModelZoo's default is 0.1; 0.0 keeps what a params file without the key trained before
    attention_dropout_rate: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        0.0,
        description="dropout on the attention probabilities (Hugging Face's attn_pdrop); null: "
        "dropout_rate, as in ModelZoo",
    )
    norm_type: Literal["layernorm"] = Field("layernorm", description="LayerNorm before attention and MLP")
    use_projection_bias_in_attention: Literal[True] = Field(True, description="q, k, v have biases")
    use_ffn_bias_in_attention: Literal[True] = Field(True, description="the attention output has a bias")
    use_ffn_bias: Literal[True] = Field(True, description="the MLP's layers have biases")
    use_bias_in_output: Literal[False] = Field(False, description="the LM head has no bias")

    @property
    def embedding_dropout(self) -> float:
        """``embedding_dropout_rate``, or ``dropout_rate`` where it is left out (ModelZoo's default)."""
        return self.dropout_rate if self.embedding_dropout_rate is None else self.embedding_dropout_rate

    @property
    def attention_dropout(self) -> float:
        """``attention_dropout_rate``, or ``dropout_rate`` where it is null (ModelZoo's meaning)."""
        return self.dropout_rate if self.attention_dropout_rate is None else self.attention_dropout_rate


class ExtraAttentionParams(Section):
    """Grouped-query attention's settings (``attention_module: multiquery_attention``)."""

    num_kv_groups: PositiveInt = Field(description="key/value heads of grouped-query attention")


LlamaNoDropout = Annotated[
    float,
    only_zero(
        "must be 0.0 for llama: weightstream implements attention dropout for gpt2/gpt3 only "
        "(Hugging Face's LlamaForCausalLM attention_dropout is not implemented)"
    ),
]


class LlamaModelParams(_LanguageModelParams):
    """ModelZoo's ``name: llama`` keys, as Hugging Face's ``LlamaForCausalLM`` implements them."""

    name: Literal["llama"] = Field(description="the model family")
    filter_size: PositiveInt = Field(
        description="SwiGLU's inner size (intermediate_size); no default, as in ModelZoo"
    )
    position_embedding_type: Literal["rotary"] = Field("rotary", description="rotary position embeddings")
    rope_theta: PositiveFloat = Field(10000.0, description="the base of the rotary frequencies")
    rotary_dim: PositiveInt | None = Field(
        None, description="rotated dimensions of each head; null: the whole head (as Hugging Face's LLaMA)"
    )
    # RoPE scaling, as Hugging Face's rope_parameters (numerics/rope_scaling.py)
    pos_scaling_type: Literal["linear", "llama3"] = Field(
        "linear",
        description="RoPE scaling: linear divides every frequency by the factor, llama3 (Llama 3.1) only "
        "the low ones, with its three pos_scaling_extra_args",
    )
    pos_scaling_factor: PositiveFloat = Field(
        1.0, description="the RoPE scaling factor (linear by 1.0: none)"
    )
    pos_scaling_extra_args: dict[str, float | int] | None = Field(
        default=None,
        validate_default=True,
        description="llama3's low_freq_factor, high_freq_factor and original_max_position_embeddings",
    )
    norm_type: Literal["rmsnorm"] = Field("rmsnorm", description="RMSNorm before attention and MLP")
    nonlinearity: Literal["swiglu"] = Field("swiglu", description="the MLP is SwiGLU (gate, up, down)")
    share_embedding_weights: bool = Field(False, description="true: the LM head is the token embeddings")
    # Hugging Face's attention_bias puts a bias on q, k, v and o alike: the two keys must agree
    use_projection_bias_in_attention: bool = Field(
        False, description="q, k, v have biases (must agree with use_ffn_bias_in_attention)"
    )
    use_ffn_bias_in_attention: bool = Field(False, description="the attention output (o) has a bias")
    use_ffn_bias: bool = Field(False, description="gate, up and down have biases (mlp_bias)")
    use_bias_in_output: Literal[False] = Field(False, description="LlamaForCausalLM's head has no bias")
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = Field(
        "aiayn_attention",
        description="multiquery_attention with extra_attention_params.num_kv_groups: grouped-query attention",
    )
    extra_attention_params: ExtraAttentionParams | None = Field(
        None, description="grouped-query attention's settings"
    )
    dropout_rate: ZeroDropout = Field(0.0, description="only 0.0 (dropout is not implemented for llama)")
    embedding_dropout_rate: ZeroDropout = Field(0.0, description="only 0.0")
    attention_dropout_rate: LlamaNoDropout = Field(0.0, description="only 0.0")

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
    """A fully connected classifier (ModelZoo's fc_mnist)."""

    name: Literal["fc_mlp"] = Field(description="the model family")
    input_size: PositiveInt = Field(description="features per sample")
    hidden_size: PositiveInt = Field(description="the width of every hidden layer")
    depth: PositiveInt = Field(description="hidden layers")
    num_classes: PositiveInt = Field(10, description="classes of the output layer")
    activation_fn: Literal["relu"] = Field("relu", description="the activation after each hidden layer")
    dropout: ZeroDropout = Field(0.0, description="only 0.0 (dropout is not implemented)")
    fp16_type: HalfType | None = Field(None, description="bfloat16 on the wire; null: fp32 throughout")

"""From validated params to the numerics' own configs, and back to YAML."""

from __future__ import annotations

import yaml

from weightstream.numerics import (
    FCMLPConfig,
    GPT2Config,
    LlamaConfig,
    ModelDef,
    OptimizerConfig,
    SchedulePiece,
    build_fc_mlp,
    build_gpt2,
    build_llama,
)
from weightstream.numerics.rope_scaling import RopeScaling, make_rope_scaling
from weightstream.params.initializer_schema import to_numerics
from weightstream.params.schema import (
    GPT2ModelParams,
    LlamaModelParams,
    OptimizerParams,
    Params,
    SchedulePieceParams,
)

__all__ = ["dump_params", "model_def", "optimizer_config", "rope_scaling"]


# ---------------------------------------------------------------------------------------------------------
def model_def(p: Params) -> ModelDef:
    m = p.model
    if isinstance(m, GPT2ModelParams):
        return build_gpt2(
            GPT2Config(
                vocab_size=m.vocab_size,
                n_positions=m.max_position_embeddings,
                n_embd=m.hidden_size,
                n_layer=m.num_hidden_layers,
                n_head=m.num_heads,
                n_inner=m.inner_size,
                layer_norm_epsilon=m.layer_norm_epsilon,
                initializer_range=m.initializer_range,
                initializer=to_numerics(m.initializer),
                embedding_initializer=to_numerics(m.embedding_initializer),
                output_layer_initializer=to_numerics(m.output_layer_initializer),
                tie_word_embeddings=m.share_embedding_weights,
                dropout_rate=m.dropout_rate,
                embedding_dropout_rate=m.embedding_dropout,
                attention_dropout_rate=m.attention_dropout,
                activation=m.nonlinearity,
            )
        )
    if isinstance(m, LlamaModelParams):
        return build_llama(
            LlamaConfig(
                vocab_size=m.vocab_size,
                max_position_embeddings=m.max_position_embeddings,
                hidden_size=m.hidden_size,
                num_layers=m.num_hidden_layers,
                num_heads=m.num_heads,
                num_kv_heads=m.num_kv_heads,
                intermediate_size=m.inner_size,
                rms_norm_eps=m.layer_norm_epsilon,
                rope_theta=m.rope_theta,
                initializer_range=m.initializer_range,
                initializer=to_numerics(m.initializer),
                embedding_initializer=to_numerics(m.embedding_initializer),
                output_layer_initializer=to_numerics(m.output_layer_initializer),
                attention_bias=m.use_projection_bias_in_attention,
                mlp_bias=m.use_ffn_bias,
                tie_word_embeddings=m.share_embedding_weights,
                rope_scaling=rope_scaling(m),
            )
        )
    return build_fc_mlp(FCMLPConfig(m.input_size, (m.hidden_size,) * m.depth, m.num_classes))


def rope_scaling(m: LlamaModelParams) -> RopeScaling | None:
    """The pos_scaling_* keys as the numerics' RoPE scaling; None for none (linear by 1.0, the default)."""
    return make_rope_scaling(m.pos_scaling_type, m.pos_scaling_factor, m.pos_scaling_extra_args)


def _schedule_piece(piece: SchedulePieceParams) -> SchedulePiece:
    """One schedule piece, with ModelZoo's defaults where the params leave a key out (cross_check has
    made sure each scheduler has the keys it requires)."""
    if piece.scheduler == "Constant":
        lr = piece.learning_rate if piece.learning_rate is not None else piece.initial_learning_rate
        assert lr is not None
        return SchedulePiece("Constant", lr, lr, piece.total_iters or 1 << 62)
    init, iters = piece.initial_learning_rate, piece.total_iters
    assert init is not None and iters is not None
    if piece.scheduler == "Exponential":
        assert piece.decay_rate is not None
        return SchedulePiece(
            "Exponential", init, init, iters, decay_rate=piece.decay_rate, staircase=bool(piece.staircase)
        )
    assert piece.end_learning_rate is not None
    power = 1.0 if piece.power is None else piece.power
    return SchedulePiece(piece.scheduler, init, piece.end_learning_rate, iters, power=power)


def optimizer_config(o: OptimizerParams) -> OptimizerConfig:
    return OptimizerConfig(
        kind=o.optimizer_type,
        schedule=tuple(map(_schedule_piece, o.learning_rate)),
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        nesterov=o.nesterov,
        max_gradient_norm=o.max_gradient_norm,
        exclude_bias_and_norm=o.exclude_bias_and_norm_from_weight_decay,
    )


def dump_params(p: Params) -> str:
    """The resolved params (every default filled in) as YAML, as written to model_dir/params.yaml."""
    return yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False)

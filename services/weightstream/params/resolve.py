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
from weightstream.params.schema import GPT2ModelParams, LlamaModelParams, OptimizerParams, Params

__all__ = ["dump_params", "model_def", "optimizer_config"]


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
                tie_word_embeddings=m.share_embedding_weights,
                dropout_rate=m.dropout_rate,
                embedding_dropout_rate=m.embedding_dropout,
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
                attention_bias=m.use_projection_bias_in_attention,
                mlp_bias=m.use_ffn_bias,
                tie_word_embeddings=m.share_embedding_weights,
            )
        )
    return build_fc_mlp(FCMLPConfig(m.input_size, (m.hidden_size,) * m.depth, m.num_classes))


def optimizer_config(o: OptimizerParams) -> OptimizerConfig:
    pieces = []
    for piece in o.learning_rate:
        if piece.scheduler == "Constant":
            lr = piece.learning_rate if piece.learning_rate is not None else piece.initial_learning_rate
            assert lr is not None  # cross_check guarantees it
            pieces.append(SchedulePiece("Constant", lr, lr, piece.total_iters or 1 << 62))
        else:
            assert piece.initial_learning_rate is not None and piece.end_learning_rate is not None
            assert piece.total_iters is not None
            pieces.append(
                SchedulePiece(
                    piece.scheduler, piece.initial_learning_rate, piece.end_learning_rate, piece.total_iters
                )
            )
    return OptimizerConfig(
        kind=o.optimizer_type,
        schedule=tuple(pieces),
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

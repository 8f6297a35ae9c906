"""What a step's summed token losses are divided by: ModelZoo's ``loss_scaling`` and ``loss_weight``.

ModelZoo's GPT-2 loss (``GPTLMHeadModelLoss``) sums the per-token cross-entropies with padding masked out and

- ``num_tokens`` (the default) divides the sum by the counted (not padding) tokens: the mean token loss;
- ``batch_size`` divides it by the batch size and multiplies by ``loss_weight`` (ModelZoo suggests
  1 / max_sequence_length, which equals ``num_tokens`` when there is no padding).

Both are one division by a *denominator* here, so the numerics keep a single ``denom`` argument: the counted
tokens, or batch_size / loss_weight. It is the *global* batch's (``train_input.batch_size``, or
``eval_input.batch_size`` for evaluation), never a worker's shard's, so N workers' gradients sum to one
worker's. The activation servers and the in-process reference both ask ``loss_denominator``, so the rule
lives here only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from weightstream.data.processors import DataProcessor
from weightstream.params.schema import FCMLPModelParams, LanguageModelParams

__all__ = ["NUM_TOKENS", "LossScaling", "loss_denominator", "loss_scaling"]


@dataclass(frozen=True)
class LossScaling:
    kind: Literal["num_tokens", "batch_size"] = "num_tokens"
    weight: float = 1.0  # loss_weight: a factor on the loss with batch_size (1.0 with num_tokens)


NUM_TOKENS = LossScaling()


def loss_scaling(model: LanguageModelParams | FCMLPModelParams) -> LossScaling:
    """The model section's ``loss_scaling``/``loss_weight``; num_tokens for models without them (fc_mlp:
    one target per sample, so the mean over the batch)."""
    if isinstance(model, LanguageModelParams):
        return LossScaling(model.loss_scaling, model.loss_weight)
    return NUM_TOKENS


def loss_denominator(data: DataProcessor, step: int, scaling: LossScaling = NUM_TOKENS) -> float:
    """The denominator of step ``step`` of ``data`` (a split's processor: its ``batch_size`` is the global
    batch's): the summed token losses of the global batch divided by it is the loss.

    num_tokens: the counted targets (``global_tokens``: for HDF5 data a read of the step's mask rows), as
    a float equal to the count (exact below 2**53, so the loss and gradients are bitwise those of an int).
    batch_size: batch_size / loss_weight, without reading anything."""
    if scaling.kind == "batch_size":
        return data.batch_size / scaling.weight
    return float(data.global_tokens(step))

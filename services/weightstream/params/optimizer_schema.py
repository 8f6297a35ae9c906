"""The ``optimizer:`` section and its learning-rate schedule."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from weightstream.params.section import Section

_SCHEDULER_NAMES = {"constant": "Constant", "linear": "Linear", "cosinedecay": "CosineDecay"}


def _renamed(v: Any, renames: dict[str, str]) -> Any:
    """``v`` (a section as parsed) with older key names replaced by the current ones; both given is an
    error naming them."""
    if not isinstance(v, dict):
        return v
    both = [f"{old} and {new}" for old, new in renames.items() if old in v and new in v]
    if both:
        raise ValueError(f"give one of {', '.join(both)} (older and current names of one setting)")
    return {renames.get(k, k): x for k, x in v.items()}


class SchedulePieceParams(Section):
    scheduler: Literal["Constant", "Linear", "CosineDecay"]
    initial_learning_rate: Annotated[float, Field(ge=0)] | None = None
    end_learning_rate: Annotated[float, Field(ge=0)] | None = None
    learning_rate: Annotated[float, Field(ge=0)] | None = None  # Constant's value
    total_iters: PositiveInt | None = None  # may be left out only by a last, Constant piece

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, v: Any) -> Any:
        """ModelZoo's older ``steps`` is ``total_iters``."""
        return _renamed(v, {"steps": "total_iters"})

    @field_validator("scheduler", mode="before")
    @classmethod
    def _canonical_name(cls, v: Any) -> Any:
        return _SCHEDULER_NAMES.get(v.lower().replace("_", ""), v) if isinstance(v, str) else v


class OptimizerParams(Section):
    optimizer_type: Literal["adamw", "adam", "sgd"]
    learning_rate: list[SchedulePieceParams] = Field(min_length=1)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    nesterov: bool = False
    max_gradient_norm: PositiveFloat | None = None
    # ModelZoo's rule: biases and normalisation weights get no weight decay; false decays every tensor
    exclude_bias_and_norm_from_weight_decay: bool = True
    # what weightstream always does, so accepted as long as they say so (the other value is refused)
    correct_bias: bool = True  # Adam's bias correction (also spelled use_bias_correction)
    amsgrad: bool = False

    @field_validator("correct_bias")
    @classmethod
    def _bias_corrected(cls, v: bool) -> bool:
        if not v:
            raise ValueError(
                "weightstream always applies Adam's bias correction (as torch's Adam/AdamW): only true"
            )
        return v

    @field_validator("amsgrad")
    @classmethod
    def _no_amsgrad(cls, v: bool) -> bool:
        if v:
            raise ValueError("AMSGrad is not implemented: only false")
        return v

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, v: Any) -> Any:
        """ModelZoo's older spellings: beta1/beta2 (betas), epsilon (eps), weight_decay_rate (weight_decay),
        use_bias_correction (correct_bias)."""
        if isinstance(v, dict) and ("beta1" in v or "beta2" in v):
            if "betas" in v:
                raise ValueError("give either betas or beta1/beta2, not both")
            v = {k: x for k, x in v.items() if k not in ("beta1", "beta2")} | {
                "betas": [v.get("beta1", 0.9), v.get("beta2", 0.999)]
            }
        renames = {
            "epsilon": "eps",
            "weight_decay_rate": "weight_decay",
            "use_bias_correction": "correct_bias",
        }
        return _renamed(v, renames)

    @field_validator("optimizer_type", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _constant_from_number(cls, v: Any) -> Any:
        """A bare number means one Constant piece, so both forms validate through one model."""
        if isinstance(v, int | float) and not isinstance(v, bool):
            if v < 0:  # checked here so the message names the key the user wrote
                raise ValueError("Input should be greater than or equal to 0")
            return [{"scheduler": "Constant", "learning_rate": v}]
        return v

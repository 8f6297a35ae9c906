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

from weightstream.params.errors import Problem
from weightstream.params.section import Section, renamed

__all__ = ["SCHEDULERS", "SCHEDULER_KEYS", "OptimizerParams", "SchedulePieceParams", "canonical_scheduler"]

SCHEDULERS = ("Constant", "Linear", "CosineDecay", "Exponential", "Polynomial")
# ModelZoo finds a scheduler by its lower-cased name with or without "LR" (linear, LinearLR, ...)
_SCHEDULER_NAMES = {n.lower() + lr: n for n in SCHEDULERS for lr in ("", "lr")}


def canonical_scheduler(name: str) -> str:
    """A schedule piece's name in any of ModelZoo's spellings (``Linear``, ``linear``, ``LinearLR``, the
    trainer: layout's class names) as the legacy one (``Linear``); an unknown name as it is."""
    return _SCHEDULER_NAMES.get(name.lower().replace("_", ""), name)


# The keys each scheduler takes, as cerebras.pytorch 2.10's ConstantLR, LinearLR, CosineDecayLR,
# ExponentialLR and PolynomialLR name their arguments (Constant's value may also be initial_learning_rate).
# Linear's alpha is in ModelZoo's old GPT-2 files, where it never had an effect: accepted, ignored.
# cycle has no effect on any learning rate in ModelZoo (numerics.optim.SchedulePiece says why).
SCHEDULER_KEYS: dict[str, frozenset[str]] = {
    "Constant": frozenset({"learning_rate", "initial_learning_rate", "total_iters"}),
    "Linear": frozenset({"initial_learning_rate", "end_learning_rate", "total_iters", "cycle", "alpha"}),
    "CosineDecay": frozenset({"initial_learning_rate", "end_learning_rate", "total_iters"}),
    "Exponential": frozenset({"initial_learning_rate", "total_iters", "decay_rate", "staircase"}),
    "Polynomial": frozenset({"initial_learning_rate", "end_learning_rate", "total_iters", "power", "cycle"}),
}
_DECAYS = ("initial_learning_rate", "end_learning_rate", "total_iters")
_REQUIRES: dict[str, tuple[str, ...]] = {  # Constant's own rules are in SchedulePieceParams.problems
    "Linear": _DECAYS,
    "CosineDecay": _DECAYS,
    "Exponential": ("initial_learning_rate", "total_iters", "decay_rate"),
    "Polynomial": _DECAYS,
}


class SchedulePieceParams(Section):
    """One piece of the learning-rate schedule; the pieces run one after another, each for its
    ``total_iters`` steps. Each scheduler takes only its own keys (``SCHEDULER_KEYS``)."""

    scheduler: Literal["Constant", "Linear", "CosineDecay", "Exponential", "Polynomial"] = Field(
        description="the piece's shape, in any of ModelZoo's spellings (Linear, linear, LinearLR)"
    )
    initial_learning_rate: Annotated[float, Field(ge=0)] | None = Field(
        None, description="the learning rate at the piece's start"
    )
    end_learning_rate: Annotated[float, Field(ge=0)] | None = Field(
        None, description="the learning rate at the piece's end (Linear, CosineDecay, Polynomial)"
    )
    learning_rate: Annotated[float, Field(ge=0)] | None = Field(None, description="Constant's value")
    total_iters: PositiveInt | None = Field(
        None,
        description="the piece's steps; may be left out only by a last, Constant piece (older names: steps, "
        "decay_steps)",
    )
    decay_rate: Annotated[float, Field(ge=0)] | None = Field(
        None,
        description="Exponential: lr = initial_learning_rate * decay_rate ** (t / total_iters), "
        "t // total_iters if staircase",
    )
    staircase: bool | None = Field(None, description="Exponential: decay in whole steps; null: false")
    # power >= 0 keeps every learning rate between the two
    power: Annotated[float, Field(ge=0)] | None = Field(
        None,
        description="Polynomial: lr = (initial - end) * (1 - t / total_iters) ** power + end; null: 1.0",
    )
    cycle: bool | None = Field(
        None, description="Linear, Polynomial: accepted, changes nothing (as in ModelZoo)"
    )
    alpha: float | None = Field(None, description="Linear: accepted, changes nothing (as in ModelZoo)")

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, v: Any) -> Any:
        """ModelZoo's older ``steps`` and ``decay_steps`` are ``total_iters``."""
        return renamed(renamed(v, {"steps": "total_iters"}), {"decay_steps": "total_iters"})

    @field_validator("scheduler", mode="before")
    @classmethod
    def _canonical_name(cls, v: Any) -> Any:
        return canonical_scheduler(v) if isinstance(v, str) else v

    def problems(self, at: str, last: bool) -> list[Problem]:
        """What this piece lacks, and the keys it has that its scheduler does not take, each at its key
        path (``at``: the piece's, e.g. ``optimizer.learning_rate[1]``; ``last``: it ends the schedule)."""
        s, out = self.scheduler, list[Problem]()
        if s == "Constant":
            if self.learning_rate is None and self.initial_learning_rate is None:
                out.append(Problem(f"{at}.learning_rate", "is required by the Constant scheduler"))
            if self.total_iters is None and not last:
                out.append(Problem(f"{at}.total_iters", "is required for every piece but the last"))
        out += [
            Problem(f"{at}.{key}", f"is required by the {s} scheduler")
            for key in _REQUIRES.get(s, ())
            if getattr(self, key) is None
        ]
        for key in sorted(set().union(*SCHEDULER_KEYS.values()) - SCHEDULER_KEYS[s]):
            if getattr(self, key) is not None:
                out.append(Problem(f"{at}.{key}", _not_taken(key, s), getattr(self, key)))
        return out


def _not_taken(key: str, scheduler: str) -> str:
    """Why ``scheduler`` refuses ``key``, and what it takes instead."""
    if key == "learning_rate":
        rates = " and ".join(
            k for k in ("initial_learning_rate", "end_learning_rate") if k in SCHEDULER_KEYS[scheduler]
        )
        return f"applies to Constant pieces; {scheduler} takes {rates}"
    if key == "alpha" and scheduler == "CosineDecay":
        return (
            "ModelZoo's CosineDecay has no alpha (its floor is end_learning_rate: for Keras' alpha, set "
            "end_learning_rate to alpha * initial_learning_rate); alpha is accepted on Linear pieces only"
        )
    *others, final = [n for n in SCHEDULERS if key in SCHEDULER_KEYS[n]]
    takers = f"{', '.join(others)} and {final}" if others else final
    return f"applies to {takers} pieces, not {scheduler}"


class OptimizerParams(Section):
    """The optimizer, its settings and its learning-rate schedule."""

    optimizer_type: Literal["adamw", "adam", "sgd"] = Field(
        description="AdamW (decoupled weight decay), Adam (weight decay as L2 on the gradient) or SGD"
    )
    learning_rate: list[SchedulePieceParams] = Field(
        min_length=1, description="a number (a constant rate) or the schedule's pieces, in order"
    )
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="Adam's moment decay rates (older spelling: beta1, beta2)"
    )
    eps: PositiveFloat = Field(
        1e-6,
        description="Adam's epsilon: ModelZoo's default for Adam and AdamW (cerebras.pytorch), not torch's "
        "1e-8 (older spelling: epsilon)",
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        0.0, description="the weight decay rate (older spelling: weight_decay_rate)"
    )
    momentum: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="SGD's momentum")
    nesterov: bool = Field(False, description="SGD: Nesterov momentum")
    max_gradient_norm: PositiveFloat | None = Field(
        None, description="clip the global gradient norm to this; null: no clipping"
    )
    exclude_bias_and_norm_from_weight_decay: bool = Field(
        True,
        description="ModelZoo's rule: biases and normalisation weights get no weight decay; false decays "
        "every tensor",
    )
    # what weightstream always does, so accepted as long as they say so (the other value is refused)
    correct_bias: bool = Field(
        True, description="Adam's bias correction: only true (also spelled use_bias_correction)"
    )
    amsgrad: bool = Field(False, description="only false (AMSGrad is not implemented)")

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
        return renamed(v, renames)

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

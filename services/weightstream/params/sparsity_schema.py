"""ModelZoo's ``sparsity:`` block as a params section: static masks, or gradual magnitude pruning (gmp).

The keys are cerebras.pytorch's (``sparse.configure``): ``algorithm``, ``sparsity`` (or its alias
``schedule``), ``init_method``, ``param_filter``, ``update``, ``seed``. A level schedule is a mapping with a
``type`` (``linear``, ``exp``, ``power``, ``cosine``) and that type's own keys; a per-glob mapping of levels
has globs for keys. What the schedules compute is in ``numerics/sparsity_schedule.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveInt,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from weightstream.params.section import Section

__all__ = [
    "LEVEL_TAGS",
    "LEVEL_TYPES",
    "CosineLevel",
    "ExpLevel",
    "LevelScheduleParams",
    "LinearLevel",
    "PowerLevel",
    "ScheduleParams",
    "SparsityParams",
    "UpdateParams",
]


class LevelScheduleParams(Section):
    """The level of zeros as a function of the step (``algorithm: gmp``): one class per ``type``, each
    with cerebras.pytorch's keys for it, so a key of another type is an unknown key here."""

    type: str = Field(description="the schedule's shape (any case)")
    init: float = Field(description="the level at step 0")

    @field_validator("type", mode="before")
    @classmethod
    def _any_case(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v


class LinearLevel(LevelScheduleParams):
    """init + step * slope"""

    type: Literal["linear"] = Field(description="the schedule's shape (any case)")
    slope: float = Field(description="the level added per step")


class ExpLevel(LevelScheduleParams):
    """final - (final - init) * exp(step * gamma)"""

    type: Literal["exp"] = Field(description="the schedule's shape (any case)")
    gamma: float = Field(description="the rate of approach to final, per step (negative approaches it)")
    final: float = Field(1.0, description="the level the schedule approaches")


class PowerLevel(LevelScheduleParams):
    """init * beta ** step"""

    type: Literal["power"] = Field(description="the schedule's shape (any case)")
    beta: float = Field(description="the factor per step")


class CosineLevel(LevelScheduleParams):
    """From init down to minimum and back every 2 * half_period steps."""

    type: Literal["cosine"] = Field(description="the schedule's shape (any case)")
    half_period: float = Field(description="steps from init to minimum (not 0)")
    minimum: float = Field(0.0, description="the lowest level")

    @field_validator("half_period")
    @classmethod
    def _not_zero(cls, v: float) -> float:
        if v == 0:
            raise ValueError("must not be 0 (a cosine's half period, in steps)")
        return v


class _RefusedLevel(Section, extra="allow"):
    """A level schedule type weightstream refuses, by name."""

    type: Any

    @field_validator("type")
    @classmethod
    def _refused(cls, v: Any) -> Any:
        kind = str(v).lower()
        if kind == "constant":
            raise ValueError(
                "a constant level never changes the mask: write the level itself with algorithm: static"
            )
        if kind == "cycling":
            raise ValueError("the cycling level schedule is not implemented (linear, exp, power, cosine are)")
        raise ValueError(f"must be one of {', '.join(LEVEL_TYPES)} (a level schedule's type)")


LEVEL_TYPES: dict[str, type[LevelScheduleParams]] = {
    "linear": LinearLevel,
    "exp": ExpLevel,
    "power": PowerLevel,
    "cosine": CosineLevel,
}


def _type_tag(v: Any) -> str:
    kind = v.type if isinstance(v, LevelScheduleParams) else str(v.get("type", "")).lower()
    return kind if kind in LEVEL_TYPES else "refused"


# the level schedules a validated section holds: a _RefusedLevel never validates (its validator raises)
ScheduleParams = LinearLevel | ExpLevel | PowerLevel | CosineLevel

AnyLevelSchedule = Annotated[
    Annotated[LinearLevel, Tag("linear")]
    | Annotated[ExpLevel, Tag("exp")]
    | Annotated[PowerLevel, Tag("power")]
    | Annotated[CosineLevel, Tag("cosine")]
    | Annotated[_RefusedLevel, Tag("refused")],
    Discriminator(_type_tag),
]


MAX_UPDATE_STEPS = 100_000  # listed update steps: more is no schedule anyone writes by hand


class UpdateParams(Section):
    """When gmp makes the masks again: every ``freq`` steps from ``start`` until before ``stop``, or at the
    ``steps`` listed. Steps count updates applied (the first update is step 1; 0 is the start)."""

    freq: PositiveInt | None = Field(None, description="make the masks again every this many steps")
    start: NonNegativeInt | None = Field(None, description="the first step freq counts from; null: 0")
    stop: PositiveInt | None = Field(None, description="no updates from this step on; null: none stop")
    steps: Annotated[list[NonNegativeInt], Field(max_length=MAX_UPDATE_STEPS)] | None = Field(
        None, description="the steps to make the masks at, instead of freq, start and stop"
    )

    @model_validator(mode="after")
    def _one_form(self) -> UpdateParams:
        if self.steps is not None and (self.freq, self.start, self.stop) != (None, None, None):
            raise ValueError("give either steps or freq/start/stop")
        if self.steps is None and self.freq is None:
            raise ValueError("needs freq (or steps)")
        if self.steps is not None and not self.steps:
            raise ValueError("steps must list at least one step")
        return self


def _tag(v: Any) -> str:
    """Which form a level takes: a mapping with a ``type`` is a schedule, another mapping is per glob."""
    if isinstance(v, LevelScheduleParams) or (isinstance(v, dict) and "type" in v):
        return "schedule"
    return "per_glob" if isinstance(v, dict) else "level"


# the tags never reach a user: load.py leaves them out of key paths (LEVEL_TAGS)
LEVEL_TAGS = ("level", "schedule", "per_glob", "refused", *LEVEL_TYPES)
Level = Annotated[
    Annotated[float, Tag("level")] | Annotated[AnyLevelSchedule, Tag("schedule")], Discriminator(_tag)
]
Levels = Annotated[
    Annotated[float, Tag("level")]
    | Annotated[AnyLevelSchedule, Tag("schedule")]
    | Annotated[dict[str, Level], Tag("per_glob")],
    Discriminator(_tag),
]


class SparsityParams(Section):
    """ModelZoo's ``sparsity:`` block: unstructured weight sparsity, fixed masks (``algorithm: static``) or
    masks made again from the weights' magnitudes as the level rises (``algorithm: gmp``)."""

    # first: the checks of sparsity and update read it
    algorithm: str = Field(
        "static", description="static (masks fixed for the whole run) or gmp (gradual magnitude pruning)"
    )
    sparsity: Levels = Field(
        description="the fraction of zeros (static) or its schedule (gmp): one for every tensor "
        "param_filter selects, or per glob of tensor names (each tensor takes the first glob, in the "
        "file's order, that matches it); also spelled schedule"
    )
    init_method: Literal["random", "topk", "balanced-topk", "checkerboard"] = Field(
        "random", description="how the first masks are drawn"
    )
    param_filter: str | list[str] | None = Field(
        None,
        description="globs over the tensor names (Hugging Face's or ModelZoo's); null: every 2-D weight "
        "of a linear layer (not the embeddings or the LM head; norms and biases are 1-D)",
    )
    update: UpdateParams | None = Field(
        None, description="gmp: when masks are made again; null: after every step"
    )
    seed: NonNegativeInt | None = Field(
        None, description="the seed of the random masks; null: runconfig.seed"
    )

    @model_validator(mode="before")
    @classmethod
    def _schedule_alias(cls, v: Any) -> Any:
        """cerebras.pytorch takes ``schedule`` for ``sparsity``."""
        if not isinstance(v, dict):
            return v
        if "schedule" in v and "sparsity" in v:
            raise ValueError("give one of sparsity and schedule (schedule is another name for sparsity)")
        return {("sparsity" if k == "schedule" else k): x for k, x in v.items()}

    @field_validator("sparsity")
    @classmethod
    def _levels_fit_the_algorithm(cls, v: Any, info: ValidationInfo) -> Any:
        levels = list(v.values()) if isinstance(v, dict) else [v]
        for level in levels:
            if isinstance(level, float) and not 0.0 <= level < 1.0:
                raise ValueError(f"must be a fraction of zeros in [0, 1) (got {level!r})")
        scheduled = [isinstance(x, LevelScheduleParams) for x in levels]
        algorithm = info.data.get("algorithm")
        if algorithm == "static" and any(scheduled):
            raise ValueError("a level schedule (a mapping with a type) needs algorithm: gmp")
        if algorithm == "gmp" and not all(scheduled):
            raise ValueError(
                "gmp needs a level schedule ({type: linear, init: 0.0, slope: ...}): a constant level never "
                "changes the mask, which is algorithm: static"
            )
        return v

    @field_validator("algorithm")
    @classmethod
    def _implemented(cls, v: str) -> str:
        if v.lower() not in ("static", "gmp"):
            raise ValueError(
                f"{v!r} is not implemented: 'static' (masks fixed for the whole run) and 'gmp' (gradual "
                "magnitude pruning) are; set and rigl are not"
            )
        return v.lower()

    @field_validator("update")
    @classmethod
    def _only_gmp(cls, v: UpdateParams | None, info: ValidationInfo) -> UpdateParams | None:
        if v is not None and info.data.get("algorithm") == "static":
            raise ValueError(
                "needs algorithm: gmp (update says when masks are made again; static ones never change)"
            )
        return v

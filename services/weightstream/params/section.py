"""The base of every params section, and value types several sections share."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
)

__all__ = ["HalfType", "Section", "ZeroDropout", "only_zero", "renamed"]


class Section(BaseModel):
    # allow_inf_nan: a NaN or infinity (``.inf``, "Infinity") anywhere in params is an error, never a value
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def only_zero(message: str) -> AfterValidator:
    """The check of a float that must be 0.0 (a rate weightstream does not implement), else ``message``:
    ``Annotated[float, only_zero(message)]``."""

    def check(v: float) -> float:
        if v != 0.0:
            raise ValueError(message)
        return v

    return AfterValidator(check)


ZeroDropout = Annotated[float, only_zero("weightstream supports only 0.0 (dropout is not implemented)")]


def _half_type(v: Any) -> Any:
    """ModelZoo's fp16_type: cbfloat16 (the CS-2's own 16-bit format) runs as bfloat16, which has its
    exponent range (the key report says so); IEEE float16 would need loss scaling, which is not here."""
    if v == "cbfloat16":
        return "bfloat16"
    if v == "float16":
        raise ValueError(
            "float16 needs fp16 loss scaling, which weightstream does not implement: use bfloat16"
        )
    return v


HalfType = Annotated[Literal["bfloat16"], BeforeValidator(_half_type)]


def renamed(v: Any, renames: dict[str, str]) -> Any:
    """``v`` (a section as parsed) with older key names replaced by the current ones; both given is an
    error naming them."""
    if not isinstance(v, dict):
        return v
    both = [f"{old} and {new}" for old, new in renames.items() if old in v and new in v]
    if both:
        raise ValueError(f"give one of {', '.join(both)} (older and current names of one setting)")
    return {renames.get(k, k): x for k, x in v.items()}

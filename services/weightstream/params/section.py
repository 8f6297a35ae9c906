"""The base of every params section, and value types several sections share."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)


class Section(BaseModel):
    # allow_inf_nan: a NaN or infinity (``.inf``, "Infinity") anywhere in params is an error, never a value
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _zero_dropout(v: float) -> float:
    if v != 0.0:
        raise ValueError("weightstream supports only 0.0 (dropout is not implemented)")
    return v


ZeroDropout = Annotated[float, AfterValidator(_zero_dropout)]

"""ModelZoo's initializer specs: ``model.initializer``, ``model.embedding_initializer`` and
``model.output_layer_initializer``.

A spec is a name (``initializer: xavier_uniform``) or a mapping with ``name`` and that kind's parameters
(``{name: truncated_normal, mean: 0.0, std: 0.02, a: -0.04, b: 0.04}``). The kinds, their parameters and
defaults are those of ModelZoo's ``layers/init.py`` (Release 2.10); a parameter set to null is left out,
as ModelZoo does. Unlike ModelZoo, which only warns, a parameter the kind does not take is an error: a
misspelt ``stddev`` would otherwise silently train with the default std. After validation every default
is filled in, so the resolved params (``dump_params``) say exactly what was drawn. ``eye`` is refused
(see ``_REFUSED``).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, cast

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from weightstream.numerics.init import Initializer, InitKind
from weightstream.params.section import Section

__all__ = ["INITIALIZER_NAMES", "InitializerParams", "kind_parameters", "to_numerics"]

_REQUIRED = object()  # a parameter without a default (constant's val)
_GAIN = {"gain": 1.0}
_KAIMING = {"a": 0.0, "mode": "fan_in", "nonlinearity": "leaky_relu"}
_VARIANCE = {"scale": 1.0, "mode": "fan_in", "distribution": "truncated_normal"}
# name -> its parameters with their defaults (truncated_normal's a, b: -2 std and 2 std, filled in below)
_KINDS: dict[str, dict[str, Any]] = {
    "constant": {"val": _REQUIRED},
    "ones": {},
    "zeros": {},
    "uniform": {"a": -0.05, "b": 0.05},
    "normal": {"mean": 0.0, "std": 0.05},
    "truncated_normal": {"mean": 0.0, "std": 0.05, "a": None, "b": None},
    "xavier_normal": _GAIN,
    "glorot_normal": _GAIN,
    "xavier_uniform": _GAIN,
    "glorot_uniform": _GAIN,
    "kaiming_normal": _KAIMING,
    "kaiming_uniform": _KAIMING,
    "variance_scaling": _VARIANCE,
    "lecun_normal": _VARIANCE,
    "lecun_uniform": {**_VARIANCE, "distribution": "uniform"},
}
INITIALIZER_NAMES = tuple(_KINDS)
# ModelZoo's aliases, as the numerics' kinds they name
_KIND: dict[str, InitKind] = {
    "glorot_normal": "xavier_normal",
    "glorot_uniform": "xavier_uniform",
    "lecun_normal": "variance_scaling",
    "lecun_uniform": "variance_scaling",
}
_REFUSED = {
    "eye": "eye (the identity) is not implemented: GPT-2's fused c_attn holds three identities side by "
    "side in ModelZoo, which a per-tensor identity would not reproduce"
}


def kind_parameters() -> dict[str, dict[str, str]]:
    """{kind: {parameter: its default as text}} of every initializer a spec may name, as validation fills
    them in ("required": the spec must give it)."""

    def shown(name: str, key: str, v: Any) -> str:
        if v is _REQUIRED:
            return "required"
        if v is None and name == "truncated_normal":
            return f"{'-' if key == 'a' else ''}2 std"
        return str(v)

    return {name: {k: shown(name, k, v) for k, v in own.items()} for name, own in _KINDS.items()}


def _hint(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class InitializerParams(Section):
    """One initializer spec, with every parameter of its kind filled in (the others stay None)."""

    # one of _KINDS: ``_spec`` refuses any other, naming the nearest
    name: str = Field(description="the kind (a spec may be this name alone: initializer: xavier_uniform)")
    mean: float | None = Field(None, description="normal, truncated_normal: the mean")
    std: float | None = Field(None, description="normal, truncated_normal: the standard deviation")
    a: float | None = Field(
        None,
        description="uniform, truncated_normal: the lower bound (truncated_normal's default: -2 std); "
        "kaiming: the negative slope",
    )
    b: float | None = Field(
        None, description="uniform, truncated_normal: the upper bound (truncated_normal's default: 2 std)"
    )
    val: float | None = Field(None, description="constant: the value to fill with (required)")
    gain: float | None = Field(None, description="xavier, glorot: the scaling factor")
    scale: float | None = Field(None, description="variance_scaling, lecun: the variance's scale (> 0)")
    mode: Literal["fan_in", "fan_out", "fan_avg"] | None = Field(
        None, description="kaiming, variance_scaling, lecun: which fan the variance divides by"
    )
    nonlinearity: Literal["leaky_relu", "relu"] | None = Field(
        None, description="kaiming: the nonlinearity its gain is for"
    )
    distribution: Literal["uniform", "normal", "truncated_normal"] | None = Field(
        None, description="variance_scaling, lecun: the distribution drawn from"
    )

    @model_validator(mode="before")
    @classmethod
    def _spec(cls, data: Any) -> Any:
        """A name alone becomes {name: ...}; unknown names and parameters are refused with the nearest
        right one; the kind's defaults are filled in."""
        if isinstance(data, InitializerParams):
            return data
        if isinstance(data, str):
            data = {"name": data}
        if not isinstance(data, dict):
            raise ValueError(
                "must be an initializer name or a mapping with `name` and its parameters, e.g. "
                "{name: truncated_normal, mean: 0.0, std: 0.02}"
            )
        data = {k: v for k, v in data.items() if v is not None}  # null: left out, as in ModelZoo
        name = data.get("name")
        if not isinstance(name, str):
            raise ValueError(f"needs a `name`: one of {', '.join(INITIALIZER_NAMES)}")
        if name in _REFUSED:
            raise ValueError(_REFUSED[name])
        if name not in _KINDS:
            raise ValueError(
                f"{name!r} is not one of ModelZoo's initializers{_hint(name, INITIALIZER_NAMES)} "
                f"(allowed: {', '.join(INITIALIZER_NAMES)})"
            )
        own = _KINDS[name]
        for key in data:
            if key != "name" and key not in own:
                takes = f"takes {', '.join(own)}" if own else "takes no parameters"
                raise ValueError(
                    f"{key} is not a parameter of {name}{_hint(str(key), list(own))} ({name} {takes})"
                )
        if own.get("val") is _REQUIRED and "val" not in data:
            raise ValueError(f"{name} needs `val`, the value to fill with")
        filled = {**{k: v for k, v in own.items() if v is not None and v is not _REQUIRED}, **data}
        std = filled.get("std")  # one that is not a number gets its own error from the field
        if name == "truncated_normal" and isinstance(std, int | float) and not isinstance(std, bool):
            filled.setdefault("a", -2 * std)  # absolute bounds, 2 std either side of 0 (not of the mean)
            filled.setdefault("b", 2 * std)
        return filled

    @model_validator(mode="after")
    def _in_range(self) -> InitializerParams:
        """What torch would refuse, or draw as NaN, is refused here by name."""
        n = self.name
        if n in ("normal", "truncated_normal") and self.std is not None and self.std < 0:
            raise ValueError(f"{n}: std must be at least 0")
        if n == "truncated_normal" and self.std == 0:
            raise ValueError("truncated_normal: std must be positive")
        if n == "uniform" and self.a is not None and self.b is not None and not self.a <= self.b:
            raise ValueError("uniform: a must not exceed b")
        if n == "truncated_normal" and self.a is not None and self.b is not None and not self.a < self.b:
            raise ValueError("truncated_normal: a must be below b")
        if n in ("kaiming_normal", "kaiming_uniform") and self.mode == "fan_avg":
            raise ValueError(f"{n}: mode must be fan_in or fan_out (fan_avg is variance_scaling's)")
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"{n}: scale must be positive")
        return self

    @model_serializer(mode="wrap")
    def _own_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only the kind's own parameters: the resolved params read like what the user wrote."""
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if k == "name" or k in _KINDS[self.name]}

    def numerics(self) -> Initializer:
        """The spec as the numerics' ``Initializer`` (init.py), ModelZoo's aliases resolved."""
        kind = _KIND.get(self.name, cast(InitKind, self.name))
        return Initializer(kind, **{k: getattr(self, k) for k in _KINDS[self.name]})


def to_numerics(spec: InitializerParams | None) -> Initializer | None:
    """``spec.numerics()``, None for a key left out (the model's default initialisation)."""
    return None if spec is None else spec.numerics()

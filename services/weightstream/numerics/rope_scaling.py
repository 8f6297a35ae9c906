"""RoPE's inverse frequencies, plain or scaled for a longer context, and their Hugging Face spelling.

Rotary embeddings turn feature pair i of each head by the angle t * inv_freq[i] at position t, with
inv_freq[i] = theta^(-2i/D). Scaling changes only inv_freq (Hugging Face's ``modeling_rope_utils``):

- ``linear`` (position interpolation): every frequency divided by ``factor``, so position t turns as far as
  position t / factor did (ModelZoo divides the positions instead: the same angles).
- ``llama3`` (Llama 3.1): with wavelength 2 pi / inv_freq measured against the context the model was
  pretrained on (``original_max_position_embeddings``, L): wavelengths longer than L / low_freq_factor are
  divided by ``factor``, those shorter than L / high_freq_factor are kept, and those between are blended,
  (1 - s) * inv_freq / factor + s * inv_freq with s = (L / wavelength - low) / (high - low), which is 0
  and 1 at the two edges (so the three pieces join continuously).

Hugging Face computes inv_freq in float32; here it is float64 (correctly rounded theta powers), which
agrees to about 1e-7 relative, and the angles are rounded once to the model's dtype (``rope_tables``).

The config.json spelling: transformers 5 reads ``rope_parameters`` (theta included); transformers 4
reads ``rope_scaling`` beside ``rope_theta``, and 5 prefers ``rope_scaling`` where both are present.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "LLAMA3_ARGS",
    "RopeScaling",
    "describe_rope_scaling",
    "hf_rope_config",
    "make_rope_scaling",
    "rope_from_hf_config",
    "rope_inv_freq",
]

ScalingKind = Literal["linear", "llama3"]
LLAMA3_ARGS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_HF_DEFAULT_THETA = 10000.0  # transformers' LlamaConfig when config.json gives none
_HF_DEFAULT_POSITIONS = 2048  # its max_position_embeddings default


@dataclass(frozen=True)
class RopeScaling:
    """One scaling of the rotary frequencies (frozen, so hashable: it keys the cached cos/sin tables)."""

    kind: ScalingKind
    factor: float
    low_freq_factor: float | None = None  # llama3 only
    high_freq_factor: float | None = None  # llama3 only
    original_max_position_embeddings: int | None = None  # llama3 only

    def __post_init__(self) -> None:
        if not _positive(self.factor):
            raise ValueError(f"RoPE scaling factor must be a positive number, got {self.factor!r}")
        extra = {k: getattr(self, k) for k in LLAMA3_ARGS}
        if self.kind == "linear":
            given = [k for k, v in extra.items() if v is not None]
            if given:
                raise ValueError(f"linear RoPE scaling takes no {', '.join(given)} (those are llama3's)")
            return
        if self.kind != "llama3":
            raise ValueError(f"RoPE scaling kind must be linear or llama3, got {self.kind!r}")
        missing = [k for k, v in extra.items() if v is None]
        if missing:
            raise ValueError(f"llama3 RoPE scaling needs {', '.join(missing)}")
        low, high, positions = (
            self.low_freq_factor,
            self.high_freq_factor,
            self.original_max_position_embeddings,
        )
        assert low is not None and high is not None and positions is not None
        if not _positive(low):
            raise ValueError(f"low_freq_factor must be a positive number, got {low!r}")
        if not (_positive(high) and high > low):
            raise ValueError(
                f"high_freq_factor must be a number larger than low_freq_factor {low}, got {high!r}"
            )
        if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
            raise ValueError(
                f"original_max_position_embeddings must be a positive integer, got {positions!r}"
            )

    def hf_fields(self) -> dict[str, Any]:
        """The scaling's own keys in Hugging Face's rope_parameters (no rope_type, no theta)."""
        fields: dict[str, Any] = {"factor": self.factor}
        if self.kind == "llama3":
            fields |= {k: getattr(self, k) for k in LLAMA3_ARGS}
        return fields


def _positive(v: object) -> bool:
    """A finite positive int or float (not a bool, a string or None)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def make_rope_scaling(
    kind: str, factor: float, extra_args: Mapping[str, Any] | None = None
) -> RopeScaling | None:
    """The scaling ``kind`` (linear or llama3) with ``factor`` and llama3's three ``extra_args``; None where
    it changes nothing (linear by 1: the plain frequencies, bit for bit). ValueError naming a key that does
    not belong to ``kind``, or one it lacks."""
    extra = dict(extra_args or {})
    allowed = LLAMA3_ARGS if kind == "llama3" else ()
    unknown = [k for k in extra if k not in allowed]
    if unknown:
        raise ValueError(
            f"{', '.join(map(str, unknown))} {'is' if len(unknown) == 1 else 'are'} not an argument of "
            f"{kind} RoPE scaling" + (f" (it takes {', '.join(allowed)})" if allowed else " (it takes none)")
        )
    if not _positive(factor):
        raise ValueError(f"RoPE scaling factor must be a positive number, got {factor!r}")
    scaling = RopeScaling(
        kind,  # type: ignore[arg-type]  # any str: RopeScaling's __post_init__ refuses other kinds
        float(factor),
        **extra,
    )
    return None if kind == "linear" and scaling.factor == 1.0 else scaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """inv_freq [D/2] float64: theta^(-2i/D), scaled as ``scaling`` says (module docstring)."""
    inv_freq = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [D/2]
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    low, high, context = (
        scaling.low_freq_factor,
        scaling.high_freq_factor,
        scaling.original_max_position_embeddings,
    )
    assert low is not None and high is not None and context is not None  # RopeScaling checked them
    wavelength = 2 * math.pi / inv_freq  # [D/2] positions per full turn
    scaled = inv_freq / scaling.factor
    s = (context / wavelength - low) / (high - low)  # [D/2] 0 at the long edge, 1 at the short edge
    blended = (1 - s) * scaled + s * inv_freq
    out = np.where(wavelength > context / low, scaled, blended)  # long waves: fully scaled
    return np.where(wavelength < context / high, inv_freq, out)  # short waves: untouched


def describe_rope_scaling(scaling: RopeScaling | None) -> str:
    """'none', 'linear, factor 2.0' or 'llama3, factor 8.0, low_freq_factor 1.0, ...' for messages."""
    if scaling is None:
        return "none"
    return ", ".join([scaling.kind] + [f"{k} {v}" for k, v in scaling.hf_fields().items()])


def hf_rope_config(theta: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """config.json's RoPE entries for a ``LlamaConfig``, read alike by transformers 4 and 5: rope_theta,
    rope_scaling (only where there is scaling, so an unscaled config stays as it was) and rope_parameters.

    transformers 4 before 4.43 knew only linear scaling, spelled {"type", "factor"}; llama3 arrived with
    the "rope_type" spelling. Each is written the way every version that knows it reads it."""
    out: dict[str, Any] = {"rope_theta": theta}
    parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        type_key = "type" if scaling.kind == "linear" else "rope_type"
        out["rope_scaling"] = {type_key: scaling.kind, **scaling.hf_fields()}
        parameters = {"rope_type": scaling.kind, **scaling.hf_fields(), "rope_theta": theta}
    out["rope_parameters"] = parameters
    return out


def rope_from_hf_config(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) of a Llama config.json, as transformers 5 reads it: ``rope_scaling`` first,
    else ``rope_parameters``; theta from that dict, else the top-level ``rope_theta``; llama3's
    original_max_position_embeddings defaults to max_position_embeddings. ValueError for a RoPE type
    weightstream does not implement (dynamic, yarn, longrope, ...)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", _HF_DEFAULT_THETA)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise ValueError(
            f"RoPE type {kind!r} is not implemented in weightstream (it implements linear and llama3 scaling)"
        )
    if "factor" not in rope:
        raise ValueError(f"{kind} RoPE scaling without a factor: {dict(rope)}")
    extra = {}
    if kind == "llama3":
        extra = {k: rope[k] for k in LLAMA3_ARGS if k in rope}
        extra.setdefault(
            "original_max_position_embeddings", config.get("max_position_embeddings", _HF_DEFAULT_POSITIONS)
        )
    return theta, make_rope_scaling(kind, rope["factor"], extra)

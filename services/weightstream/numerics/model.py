"""A model is an ordered list of streamable units over a table of named parameters.

A *unit* is what crosses the wire in weight streaming: the worker holds one unit's parameters (plus the
next one, prefetched) and runs its forward, later its backward. A parameter may be used by more than one
unit (GPT-2's tied embedding is read by the first and the last unit); its gradient is then the sum of
every unit's contribution, and it is *owned* (stored, optimised) once, by the first unit that uses it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from weightstream.numerics.init import Initializer, sample
from weightstream.numerics.layers import cross_entropy_backward, cross_entropy_forward

__all__ = [
    "ModelDef",
    "ParamSpec",
    "Unit",
    "accumulate_grads",
    "default_initializer",
    "forward_backward",
    "forward_loss",
    "init_params",
    "init_tensor",
    "weight_spec",
]

Params = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class ParamSpec:
    """One named tensor: its shape and how it is initialised: a kind with ``scale`` (the std or the bound),
    or a ModelZoo initializer (init.py) with ``fans``, the (fan_in, fan_out) of the torch layer ModelZoo
    builds for the tensor where its layout is not torch's (None: torch's rule on ``shape``)."""

    name: str
    shape: tuple[int, ...]
    init: Literal["normal", "uniform", "zeros", "ones"] | Initializer
    scale: float = 0.0
    fans: tuple[int, int] | None = None

    @property
    def numel(self) -> int:
        # Python integers: np.prod in int64 wraps around for an absurd shape and prints a wrong count
        return math.prod(int(d) for d in self.shape)


class Unit(Protocol):
    """A streamable piece of a model. ``param_names`` are global names, in a fixed order."""

    # read-only: a unit's own (a class attribute or set once in __init__), never set through a Unit
    @property
    def name(self) -> str: ...

    @property
    def param_names(self) -> tuple[str, ...]: ...

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, Any]: ...

    def backward(
        self, params: Params, saved: Any, dy: np.ndarray
    ) -> tuple[np.ndarray | None, dict[str, np.ndarray]]: ...


@dataclass(frozen=True)
class ModelDef:
    """What every role needs to know about a model: its units and its parameter table."""

    family: str
    units: tuple[Unit, ...]
    specs: dict[str, ParamSpec]  # insertion order is the canonical order of tensors
    # 2-D tensors that are not linear-layer weights (embeddings, the LM head): never sparse
    dense_only: frozenset[str] = frozenset()
    owners: dict[str, int] = field(init=False)  # parameter name -> index of the owning unit

    def __post_init__(self) -> None:
        owners: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for name in unit.param_names:
                if name not in self.specs:
                    raise ValueError(f"unit {unit.name!r} uses {name!r}, which has no ParamSpec")
                owners.setdefault(name, i)
        missing = set(self.specs) - set(owners)
        if missing:
            raise ValueError(f"parameters used by no unit: {sorted(missing)}")
        object.__setattr__(self, "owners", owners)

    def owned_by(self, unit_index: int) -> tuple[str, ...]:
        """The parameters stored with unit ``unit_index`` (its own, minus ones an earlier unit owns)."""
        return tuple(n for n in self.units[unit_index].param_names if self.owners[n] == unit_index)

    def unit_bytes(self, unit_index: int, itemsize: int = 4) -> int:
        return sum(self.specs[n].numel for n in self.units[unit_index].param_names) * itemsize

    @property
    def sparse_candidates(self) -> tuple[str, ...]:
        """The tensors that may be sparse: the 2-D weights of linear layers, in canonical order."""
        return tuple(n for n, s in self.specs.items() if len(s.shape) == 2 and n not in self.dense_only)

    @property
    def num_params(self) -> int:
        return sum(s.numel for s in self.specs.values())


def init_tensor(spec: ParamSpec, seed: int) -> np.ndarray:
    """Initialise one tensor (float32) from (seed, name) alone, so any shard can create exactly its
    own tensors without generating the rest of the model, and the result never depends on order."""
    if spec.init == "zeros":
        return np.zeros(spec.shape, dtype=np.float32)
    if spec.init == "ones":
        return np.ones(spec.shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if isinstance(spec.init, Initializer):
        return sample(spec.init, spec.shape, rng, spec.fans)
    if spec.init == "normal":
        t = rng.standard_normal(spec.shape, dtype=np.float32)
        t *= np.float32(spec.scale)
        return t
    return rng.uniform(-spec.scale, spec.scale, size=spec.shape).astype(np.float32)


def default_initializer(std: float) -> Initializer:
    """ModelZoo's default for a weight whose initializer key is left out: ``TruncatedNormalInitializer(
    mean=0, std=initializer_range)``, which cuts at 2 std either side (absolute bounds). GPT-2's and
    LLaMA's output projections take it with ``std`` already scaled by (2 num_hidden_layers)^-0.5: ModelZoo's
    ``scale_initializers_by_dimension`` scales the std and both bounds alike, so they stay at 2 std."""
    return Initializer("truncated_normal", mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


def weight_spec(
    name: str,
    shape: tuple[int, ...],
    chosen: Initializer | None,
    std: float,
    fans: tuple[int, int] | None = None,
) -> ParamSpec:
    """A weight initialised by ``chosen`` (a ModelZoo initializer key) if given, else by ModelZoo's
    default, ``default_initializer(std)``: normal(0, std) truncated at 2 std either side."""
    return ParamSpec(name, shape, chosen if chosen is not None else default_initializer(std), fans=fans)


def init_params(model: ModelDef, seed: int, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Fresh float32 parameters for ``names`` (default: all), deterministic in ``seed``."""
    return {n: init_tensor(model.specs[n], seed) for n in (names if names is not None else model.specs)}


def accumulate_grads(total: dict[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
    """total += grads, by name, in place (a tied tensor's contributions add up)."""
    for name, g in grads.items():
        if name in total:
            total[name] += g
        else:
            total[name] = g.copy()


def forward_loss(
    model: ModelDef, params: Params, inputs: np.ndarray, targets: np.ndarray, denom: float
) -> float:
    """The loss only (for evaluation): sum of per-token losses / denom."""
    x = inputs
    for unit in model.units:
        x, _ = unit.forward(params, x)
    loss, _ = cross_entropy_forward(x, targets, denom, in_place=True)
    return loss


def forward_backward(
    model: ModelDef, params: Params, inputs: np.ndarray, targets: np.ndarray, denom: float
) -> tuple[float, dict[str, np.ndarray]]:
    """One micro-batch through every unit and back, all weights resident: the in-process reference.

    ``denom`` is the whole global batch's loss denominator: its counted target tokens, or batch_size /
    loss_weight (see ``cross_entropy_forward``).
    Returns the loss contribution and the gradient of every parameter (tied contributions summed).
    """
    saved: list[Any] = []
    x = inputs
    for unit in model.units:
        x, s = unit.forward(params, x)
        saved.append(s)
    loss, ce = cross_entropy_forward(x, targets, denom, in_place=True)  # the logits are not needed after
    dy: np.ndarray | None = cross_entropy_backward(ce, x.shape)
    grads: dict[str, np.ndarray] = {}
    for unit, s in zip(reversed(model.units), reversed(saved), strict=True):
        assert dy is not None, "only the first unit may end the backward chain"
        dy, g = unit.backward(params, s, dy)
        accumulate_grads(grads, g)
    return loss, grads

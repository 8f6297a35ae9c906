"""fc_mlp: dense layers with ReLU and a softmax classifier (the shape of ModelZoo's ``fc_mnist``).

Each hidden layer is one unit, the output layer another. Weights are stored [in, out] like GPT-2's Conv1D.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from weightstream.numerics.layers import linear_backward, linear_forward, relu_backward, relu_forward
from weightstream.numerics.model import ModelDef, Params, ParamSpec

__all__ = ["FCMLPConfig", "build_fc_mlp"]


@dataclass(frozen=True)
class FCMLPConfig:
    input_size: int
    hidden_sizes: tuple[int, ...]
    num_classes: int


class DenseUnit:
    """x [B, in] -> relu(x @ W + b) [B, out]; the output layer skips the ReLU and yields logits."""

    def __init__(self, name: str, relu: bool) -> None:
        self.name = name
        self.relu = relu
        self.param_names = (f"{name}.weight", f"{name}.bias")

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        w, b = (params[n] for n in self.param_names)
        y = linear_forward(x, w, b)
        if self.relu:
            y = relu_forward(y)
        return y, (x, y)

    def backward(
        self, params: Params, saved: tuple[np.ndarray, np.ndarray], dy: np.ndarray
    ) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        x, y = saved
        w = params[self.param_names[0]]
        if self.relu:
            dy = relu_backward(y, dy)
        dx, dw, db = linear_backward(x, w, dy)
        return dx, {self.param_names[0]: dw, self.param_names[1]: db}


def build_fc_mlp(cfg: FCMLPConfig) -> ModelDef:
    sizes = (cfg.input_size, *cfg.hidden_sizes, cfg.num_classes)
    units, specs = [], []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        unit = DenseUnit("head" if last else f"fc.{i}", relu=not last)
        bound = 1.0 / math.sqrt(n_in)  # torch.nn.Linear's default init
        specs += [
            ParamSpec(unit.param_names[0], (n_in, n_out), "uniform", bound),
            ParamSpec(unit.param_names[1], (n_out,), "uniform", bound),
        ]
        units.append(unit)
    return ModelDef("fc_mlp", tuple(units), {s.name: s for s in specs})

"""A worker's neighbours faked, in-process: ``FakeUnits`` serves a unit's weights (as MemoryX through SwarmX
would) and records fetches and pushes, ``FakeBatches`` a shard of each batch (as the activation server);
``MODEL`` is TINY with four blocks, ``WEIGHTS`` its initial weights, and a test steps ``STEP`` of
``WORKERS`` workers."""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any

import numpy as np

from tests.params_files import TINY
from weightstream.data import make_data_processor
from weightstream.numerics import init_params
from weightstream.params import load_params, model_def
from weightstream.worker.engine import Tensors

WTE = "transformer.wte.weight"
STEP = 3  # not 0: the step must reach the batch source and every fetch
WORKERS = 2

# TINY with four blocks: six units, so "a bounded number of units" is visibly fewer than all of them
RAW: dict[str, Any] = copy.deepcopy(TINY)
RAW["model"]["num_hidden_layers"] = 4
PARAMS = load_params(RAW)
MODEL = model_def(PARAMS)
L = len(MODEL.units)
WEIGHTS = init_params(MODEL, PARAMS.runconfig.seed)  # what ReferenceTrainer starts from too


class FakeUnits:
    """A UnitSource serving fresh copies (as off the wire) of ``weights``; records fetches and pushes.

    ``max_live``: the most units handed out at once whose arrays were not all freed yet (tracked with
    weakref finalizers, so it counts what the engine still references, views included)."""

    def __init__(self, weights: Tensors) -> None:
        self.weights = weights
        self.fetches: list[tuple[int, int, int]] = []  # (step, unit, phase) in call order
        self.pushes: list[tuple[int, int, Tensors]] = []  # (step, unit, grads) in call order
        self.max_live = 0
        self._live: dict[int, int] = {}  # fetch number -> its arrays still alive
        self._lock = threading.RLock()

    def get_unit(self, step: int, unit: int, phase: int) -> Tensors:
        out = {n: self.weights[n].copy() for n in MODEL.units[unit].param_names}
        with self._lock:
            self.fetches.append((step, unit, phase))
            key = len(self.fetches)
            self._live[key] = len(out)
            self.max_live = max(self.max_live, len(self._live))
        for a in out.values():
            weakref.finalize(a, self._freed, key)
        return out

    @property
    def live(self) -> int:
        """Units handed out whose arrays are not all freed yet."""
        with self._lock:
            return len(self._live)

    def _freed(self, key: int) -> None:
        with self._lock:
            self._live[key] -= 1
            if not self._live[key]:
                del self._live[key]

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        with self._lock:  # copies: what went up must not change afterwards
            self.pushes.append((step, unit, {n: g.copy() for n, g in grads.items()}))

    def in_order(self) -> list[tuple[int, int, int]]:
        """``fetches`` with the first two in unit order: a step asks for units 0 and 1 at once, so either
        may be recorded first."""
        return sorted(self.fetches[:2]) + self.fetches[2:]

    def summed(self) -> Tensors:
        """Pushed gradients summed by name in push order (what MemoryX does with a tied tensor)."""
        total: Tensors = {}
        for _, _, grads in self.pushes:
            for n, g in grads.items():
                total[n] = total[n] + g if n in total else g
        return total


class FakeBatches:
    """A BatchSource backed by the real data processors."""

    def __init__(self) -> None:
        self.data = {
            "train": make_data_processor(PARAMS.train_input, PARAMS.model, "train"),
            "eval": make_data_processor(PARAMS.eval_input, PARAMS.model, "eval"),  # type: ignore[arg-type]
        }

    def get(self, split: str, step: int, worker: int, num_workers: int) -> tuple[np.ndarray, np.ndarray, int]:
        x, y = self.data[split].shard(step, worker, num_workers)
        return x, y, self.data[split].global_tokens(step)

"""One MemoryX shard: the fp32 master weights and optimizer state of the units assigned to it.

Step protocol (the coordinator drives it, each call with a deadline):
  tensors(step)           weights after ``step`` updates (waits if the update is still being applied)
  add_gradient(step, u)   the reduced gradient of unit u for this step (a tied tensor gets one per unit)
  grad_sq_sum(step)       waits until every expected gradient is in, sums them in unit order (so the
                          result is the same whatever order they arrived in), returns the sum of squares
  apply_update(step, ..)  clip, optimizer step; idempotent: a repeated call for an applied step is a no-op

Fault recovery: ``reset(generation)`` keeps the weights and optimizer state and drops the gradients of an
interrupted step; from then on gradients, norms and updates of any other generation are refused (checked
under the shard's lock, so a push of the old attempt can never land after the reset).
"""

from __future__ import annotations

import shutil
import threading
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from weightstream.memoryx.storage import load_tensors
from weightstream.numerics import ModelDef, OptimizerConfig
from weightstream.numerics.model import init_tensor
from weightstream.numerics.optim import grad_sq_sum, init_state, optimizer_step, state_names
from weightstream.transport.fencing import check_generation

__all__ = ["MemoryXShard", "StaleStepError"]


class StaleStepError(ValueError):
    """A call names a step this shard has already moved past (or has not reached)."""


class MemoryXShard:
    def __init__(
        self,
        model: ModelDef,
        opt: OptimizerConfig,
        names: Sequence[str],
        seed: int,
        timeout_s: float,
        resume_dir: str | None = None,
        storage_dir: Path | None = None,
        generation: int = 0,
    ) -> None:
        """``storage_dir``: keep weights and optimizer state in memory-mapped files there instead of RAM,
        so a shard can hold more than the machine's memory (the page cache keeps the hot part)."""
        self.model, self.opt, self.names, self.timeout_s = model, opt, tuple(names), timeout_s
        self.storage_dir = storage_dir
        if storage_dir is not None:
            storage_dir.mkdir(parents=True, exist_ok=True)
        # which units contribute a gradient to each tensor (two for a tied embedding)
        self.users = {
            n: tuple(u for u, unit in enumerate(model.units) if n in unit.param_names) for n in self.names
        }
        self.step = 0
        self.generation = generation
        if resume_dir is None:
            self.weights = {
                n: self._place(f"{n}.weight", init_tensor(model.specs[n], seed)) for n in self.names
            }
            self.state = {
                n: {
                    k: self._place(f"{n}.{k}", v)
                    for k, v in init_state(opt.kind, model.specs[n].shape).items()
                }
                for n in self.names
            }
        else:
            weights, state, self.step = self._load(resume_dir)
            self.weights = {n: self._place(f"{n}.weight", w) for n, w in weights.items()}
            self.state = {
                n: {k: self._place(f"{n}.{k}", v) for k, v in st.items()} for n, st in state.items()
            }
        self._pending: dict[str, dict[int, np.ndarray]] = {n: {} for n in self.names}
        self._grads: dict[str, np.ndarray] | None = None  # summed, once complete
        self._crcs: dict[
            str, int
        ] = {}  # checksums of the current weights: sent twice per step, computed once
        self._cond = threading.Condition()

    def _place(self, key: str, value: np.ndarray) -> np.ndarray:
        """``value`` itself in memory mode; a memory-mapped file holding a copy of it in disk mode."""
        if self.storage_dir is None:
            return value
        mm = np.memmap(self.storage_dir / f"{key}.f32", dtype=np.float32, mode="w+", shape=value.shape)
        mm[...] = value
        return mm

    def reset(self, generation: int) -> None:
        """Forget the gradients of the step in progress and accept only calls of ``generation`` from now
        on: the coordinator re-runs that step after a fault elsewhere. Weights and state stay."""
        with self._cond:
            self.generation = generation
            self._pending = {n: {} for n in self.names}
            self._grads = None
            self._cond.notify_all()  # waiters of the old generation wake up and give up

    def close(self) -> None:
        """Disk mode: the files are scratch (checkpoints are the durable copy); remove them."""
        if self.storage_dir is not None:
            self.weights, self.state = {}, {}
            shutil.rmtree(self.storage_dir, ignore_errors=True)

    # -- streaming out -------------------------------------------------------------------------------------
    def tensors(self, step: int, names: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """The weights after ``step`` updates. Arrays are shared, not copied: they are only replaced in
        place under the lock after every reader of this step is done (the coordinator's ordering)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.step >= step, timeout=self.timeout_s):
                raise TimeoutError(
                    f"weights of step {step} not ready after {self.timeout_s}s (at {self.step})"
                )
            if self.step != step:
                raise StaleStepError(f"weights of step {step} requested, shard is at step {self.step}")
            missing = [n for n in names if n not in self.weights]
            if missing:
                raise KeyError(f"tensors not on this shard: {missing}")
            return [(n, self.weights[n]) for n in names]

    def checksums(self, names: Sequence[str]) -> dict[str, int]:
        """crc32 of the named weights as they are now (cached until the next update)."""
        with self._cond:
            missing = [n for n in names if n not in self._crcs]
        fresh = {n: zlib.crc32(memoryview(self.weights[n].reshape(-1).view(np.uint8))) for n in missing}
        with self._cond:
            self._crcs.update(fresh)
            return {n: self._crcs[n] for n in names}

    # -- gradients in --------------------------------------------------------------------------------------
    def add_gradient(
        self, step: int, unit: int, grads: Mapping[str, np.ndarray], generation: int = 0
    ) -> None:
        with self._cond:
            check_generation(generation, self.generation, f"gradient of unit {unit} for step {step}")
            if step != self.step:
                raise StaleStepError(f"gradient of step {step} for unit {unit}, shard is at step {self.step}")
            for name, g in grads.items():
                if name not in self._pending:
                    raise KeyError(f"gradient for {name!r}, which this shard does not hold")
                if unit not in self.users[name]:
                    raise ValueError(f"unit {unit} does not use {name!r}")
                if unit in self._pending[name]:
                    raise ValueError(f"gradient of {name!r} from unit {unit} arrived twice in step {step}")
                if g.shape != self.weights[name].shape:
                    raise ValueError(
                        f"gradient of {name!r} has shape {g.shape}, expected {self.weights[name].shape}"
                    )
                self._pending[name][unit] = g.astype(np.float32, copy=False)
            self._cond.notify_all()

    def _complete(self) -> bool:
        return all(len(self._pending[n]) == len(self.users[n]) for n in self.names)

    def grad_sq_sum(self, step: int, generation: int = 0) -> float:
        with self._cond:
            check_generation(generation, self.generation, f"norm of step {step}")
            if step != self.step:
                raise StaleStepError(f"norm of step {step} requested, shard is at step {self.step}")
            if self._grads is None:
                done = self._cond.wait_for(
                    lambda: self.generation != generation or self._complete(), timeout=self.timeout_s
                )
                check_generation(generation, self.generation, f"norm of step {step}")
                if not done:
                    missing = {
                        n: sorted(set(self.users[n]) - set(self._pending[n]))
                        for n in self.names
                        if len(self._pending[n]) < len(self.users[n])
                    }
                    raise TimeoutError(
                        f"step {step}: gradients still missing after {self.timeout_s}s "
                        f"(tensor: units) {missing}"
                    )
                grads = {}
                for n in self.names:
                    parts = [self._pending[n][u] for u in self.users[n]]  # unit order, not arrival order
                    g = parts[0].copy() if len(parts) > 1 else parts[0]
                    for p in parts[1:]:
                        g += p
                    grads[n] = g
                self._grads = grads
            return sum(grad_sq_sum(g) for g in self._grads.values())

    def apply_update(self, step: int, lr: float, clip_coef: float, generation: int = 0) -> bool:
        """Apply the optimizer for ``step``. Returns False if it was applied already."""
        if step == self.step:
            self.grad_sq_sum(step, generation)  # waits until every gradient is in, and sums them
        with self._cond:
            check_generation(generation, self.generation, f"update of step {step}")
            if step < self.step:
                return False
            if step > self.step or self._grads is None:
                raise StaleStepError(f"update of step {step} requested, shard is at step {self.step}")
            for n in self.names:
                g = self._grads[n]
                if clip_coef != 1.0:
                    g *= np.float32(clip_coef)
                optimizer_step(self.opt, self.weights[n], g, self.state[n], step=step + 1, lr=lr)
            self._grads = None
            self._crcs = {}
            self._pending = {n: {} for n in self.names}
            self.step += 1
            self._cond.notify_all()
            return True

    # -- checkpoints ---------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
        """(weights, optimizer state flattened as '<tensor>.<state>', step), for writing a checkpoint.
        Raises ValueError naming the tensors if any value is NaN or infinite: such a checkpoint is never
        written (the coordinator stops a diverging run earlier; this holds whatever it does)."""
        with self._cond:
            state = {f"{n}.{k}": v for n in self.names for k, v in self.state[n].items()}
            weights = dict(self.weights)
            bad = [n for n, t in (*weights.items(), *state.items()) if not np.isfinite(t).all()]
            if bad:
                shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                raise ValueError(f"refusing to checkpoint step {self.step}: non-finite values in {shown}")
            return weights, state, self.step

    def _load(self, resume_dir: str) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]], int]:
        weights, step = load_tensors(resume_dir, "model", self.names)
        keys = [f"{n}.{k}" for n in self.names for k in state_names(self.opt.kind)]
        flat, _ = load_tensors(resume_dir, "optimizer", keys)
        state = {n: {k: flat[f"{n}.{k}"] for k in state_names(self.opt.kind)} for n in self.names}
        return weights, state, step

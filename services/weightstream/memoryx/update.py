"""A MemoryX shard's step: gradients in, their norm, and the optimizer applied to weights and state.

  add_gradient(step, u)   the reduced gradient of unit u for this step (a tied tensor gets one per unit)
  grad_sq_sum(step)       waits until every expected gradient is in, returns their sum of squares
  apply_update(step, ..)  clip, optimizer step; idempotent: a repeated call for an applied step is a no-op

Each call names its generation and is refused unless it is the shard's (a push of an attempt that a
fault interrupted can never land after the shard's ``reset``: checked under the shard's lock).

The update runs outside the lock, tensor by tensor in the model's order (the embedding first), each
tensor block by block through its store; as each tensor is done its checksum is forgotten and readers of
the next step may have it (``ShardProgress.updated``). Gradients of the next step, a reset and a
checkpoint wait for the whole update.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from weightstream.memoryx.errors import StaleStepError
from weightstream.memoryx.gradients import StepGradients
from weightstream.memoryx.progress import ShardProgress
from weightstream.memoryx.serving import ChecksumCache
from weightstream.memoryx.state import ShardState
from weightstream.numerics.optim import state_names, update_blocks

__all__ = ["ShardUpdate"]


class ShardUpdate:
    def __init__(
        self, state: ShardState, progress: ShardProgress, gradients: StepGradients, checksums: ChecksumCache
    ) -> None:
        self.state, self.progress, self.gradients, self.checksums = state, progress, gradients, checksums

    def add_gradient(
        self, step: int, unit: int, grads: Mapping[str, np.ndarray], generation: int = 0
    ) -> None:
        progress = self.progress
        with progress:
            progress.idle()  # a gradient of the next step can arrive before the update's last bookkeeping
            progress.check(generation, f"gradient of unit {unit} for step {step}")
            if step == progress.step + 1:
                # a replica serves no weights, so the next step can be under way before its update of
                # this one has begun: the gradient waits for it (a shard's next-step gradients come only
                # after its own update, whose weights they were computed from)
                progress.wait(lambda: progress.generation != generation or progress.step >= step)
                progress.idle()
                progress.check(generation, f"gradient of unit {unit} for step {step}")
            if step != progress.step:
                raise StaleStepError(
                    f"gradient of step {step} for unit {unit}, shard is at step {progress.step}"
                )
            self.gradients.add(step, unit, grads)
            progress.notify()

    def grad_sq_sum(self, step: int, generation: int = 0) -> float:
        """The sum of squares of this step's gradients (float64), once every expected one is in; the same
        bits whatever their arrival order (a tied tensor's parts added in unit order)."""
        progress, gradients = self.progress, self.gradients
        with progress:
            progress.check(generation, f"norm of step {step}")
            if step != progress.step:
                raise StaleStepError(f"norm of step {step} requested, shard is at step {progress.step}")
            if gradients.sq_sum is not None:
                return gradients.sq_sum
            done = progress.wait(lambda: progress.generation != generation or gradients.complete())
            progress.check(generation, f"norm of step {step}")
            if not done:
                raise TimeoutError(
                    f"step {step}: gradients still missing after {progress.timeout_s}s "
                    f"(tensor: units) {gradients.missing()}"
                )
            return gradients.total()

    def apply_update(self, step: int, lr: float, clip_coef: float, generation: int = 0) -> bool:
        """Apply the optimizer for ``step``. Returns False if it was applied already.

        Tensor by tensor in the model's order (the embedding first) and outside the lock, so that
        ``tensors(step + 1)`` serves each one as soon as it is updated; gradients of the next step,
        ``reset`` and checkpoints wait for the whole update. Where masks are made again after this step
        (dynamic sparsity) nothing is served before the end."""
        progress, state, store = self.progress, self.state, self.state.store
        if step == progress.step:
            self.grad_sq_sum(step, generation)  # waits until every gradient is in, and sums them
        with progress:
            progress.idle()  # the same step asked twice at once: the second finds it applied
            progress.check(generation, f"update of step {step}")
            if step < progress.step:
                return False
            if step > progress.step or self.gradients.sq_sum is None:
                raise StaleStepError(f"update of step {step} requested, shard is at step {progress.step}")
            progress.begin_update(step)
            remask = state.sparse.due(step + 1)
        try:
            names = state_names(state.opt.kind)
            for n in state.names:
                grad = self.gradients.key(n)

                # the first unit's tensors on both cores (memory mode: the norm thread, idle now): the next
                # step's workers wait for them
                helper = self.gradients.background if 0 in state.users[n] else None
                wd = state.opt.weight_decay_for(n)
                kw: dict[str, Any] = {
                    "step": step + 1,
                    "lr": lr,
                    "scale": clip_coef,
                    "weight_decay": wd,
                    "helper": helper,
                }
                update = partial(update_blocks, state.opt, names, **kw)

                # block by block: weight, gradient and state in, weight and state back
                store.update([n, grad, *state.state_keys[n]], update, write=[n, *state.state_keys[n]])
                if not remask:
                    with progress:
                        self.checksums.forget(n)
                        progress.updated(n)
            for n in remask:  # dynamic sparsity: masks made again from these weights
                keys = [n, *state.state_keys[n]]
                compact = state.sparse.remask(n, step + 1, [store.get(k) for k in keys])
                for key, v in zip(keys, compact, strict=True):
                    store.put(key, v)
            with progress:
                self.gradients.drop()
                if remask:
                    self.checksums.clear()
                progress.step += 1
        finally:
            with progress:
                progress.end_update()
        store.log_io(step + 1)  # what a step cost the disk, for operators and benches
        return True

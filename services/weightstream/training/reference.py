"""The in-process reference: the whole training loop in one process, every weight resident.

This is what the weight-streaming appliance must reproduce: the same data, the same initial weights,
the same gradient sums (shard by shard, in shard order) and the same optimizer. It is also a useful
trainer on its own for models that fit in memory.

Sparsity here is the plain dense way, independent of the appliance's compact storage and sparse kernels:
dense weights multiplied by their masks (the same masks: ``make_positions``), gradients masked before the
norm and the update, and weights and optimizer state masked again after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from weightstream.data import make_data_processor
from weightstream.data.loss_scaling import loss_denominator, loss_scaling
from weightstream.numerics import forward_backward, forward_loss, init_params
from weightstream.numerics.dropout import dropout_scope
from weightstream.numerics.model import accumulate_grads
from weightstream.numerics.optim import clip_coefficient, grad_sq_sum, init_state, optimizer_step
from weightstream.numerics.sparse_masks import make_positions
from weightstream.numerics.sparsity_schedule import largest_positions
from weightstream.params import Params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs
from weightstream.training.divergence import check_finite

__all__ = ["ReferenceTrainer", "StepResult"]


@dataclass(frozen=True)
class StepResult:
    step: int  # 1-based: the number of updates applied once this step is done
    loss: float
    learning_rate: float
    grad_norm: float  # global norm before clipping
    tokens: int  # counted target tokens (or samples) in the global batch
    step_time_s: float


class ReferenceTrainer:
    def __init__(self, params: Params, num_shards: int | None = None) -> None:
        self.params = params
        self.model = model_def(params)
        self.opt = optimizer_config(params.optimizer)
        self.weights = init_params(self.model, params.runconfig.seed)
        self.masks: dict[str, np.ndarray] = {}  # sparse tensors: float32 1.0 where kept, 0.0 where pruned
        self.sparsity = sparsity_specs(params, self.model)
        self.state = {n: init_state(self.opt.kind, s.shape) for n, s in self.model.specs.items()}
        for n, spec in self.sparsity.items():
            w = self.weights[n]
            self._mask(n, make_positions(n, w.shape, spec, w))
        self.train_data = make_data_processor(params.train_input, params.model, "train")
        self.eval_data = (
            make_data_processor(params.eval_input, params.model, "eval") if params.eval_input else None
        )
        self.scaling = loss_scaling(params.model)  # what the summed token losses are divided by
        self.num_shards = num_shards or params.runconfig.num_csx
        self.step = 0  # updates applied so far

    def gradients(self, step: int) -> tuple[float, dict[str, np.ndarray], int]:
        """Loss, summed gradients and counted target tokens of the global batch of ``step``, computed
        shard by shard."""
        loss = 0.0
        grads: dict[str, np.ndarray] = {}
        denom = loss_denominator(self.train_data, step, self.scaling)  # for the global batch
        for w in range(self.num_shards):
            x, y = self.train_data.shard(step, w, self.num_shards)
            with dropout_scope(self.params.runconfig.seed, step, first_sample=w * len(x)):
                part_loss, part = forward_backward(self.model, self.weights, x, y, denom)
            loss += part_loss
            accumulate_grads(grads, part)
        return loss, grads, self.train_data.global_tokens(step)

    def train_step(self) -> StepResult:
        """One step; raises TrainingDiverged (weights untouched) if its loss or gradient norm is not
        finite."""
        t0 = time.perf_counter()
        loss, grads, tokens = self.gradients(self.step)
        for name, mask in self.masks.items():
            grads[name] *= mask
        norm, coef = clip_coefficient((grad_sq_sum(g) for g in grads.values()), self.opt.max_gradient_norm)
        check_finite(self.step + 1, loss=loss, gradient_norm=norm)  # raises before the update
        lr = self.opt.learning_rate(self.step)
        for name, g in grads.items():
            optimizer_step(
                self.opt,
                self.weights[name],
                g,
                self.state[name],
                step=self.step + 1,
                lr=lr,
                scale=coef,
                weight_decay=self.opt.weight_decay_for(name),
            )
            if name in self.masks:
                self._prune(name)
        self.step += 1
        for name, spec in self.sparsity.items():  # gmp: the largest weights, as many as the level keeps
            if spec.due(self.step):
                w = self.weights[name]
                self._mask(name, largest_positions(w, spec.kept_at(w.size, self.step)))
        return StepResult(self.step, loss, lr, norm, tokens, time.perf_counter() - t0)

    def _mask(self, name: str, positions: np.ndarray) -> None:
        """Keep only ``positions`` of tensor ``name``: its weight and optimizer state are zero elsewhere."""
        mask = np.zeros(self.model.specs[name].numel, dtype=np.float32)
        mask[positions] = 1.0
        self.masks[name] = mask.reshape(self.model.specs[name].shape)
        self._prune(name)

    def _prune(self, name: str) -> None:
        """Zero tensor ``name``'s weight and optimizer state where its mask prunes."""
        for buf in (self.weights[name], *self.state[name].values()):
            buf *= self.masks[name]

    def evaluate(self) -> float:
        """Mean loss over ``runconfig.eval_steps`` batches of the eval split; TrainingDiverged if it is
        not finite."""
        if self.eval_data is None:
            raise ValueError("params have no eval_input section")
        losses = []
        for s in range(self.params.runconfig.eval_steps):
            x, y = self.eval_data.global_batch(s)
            denom = loss_denominator(self.eval_data, s, self.scaling)
            losses.append(forward_loss(self.model, self.weights, x, y, denom))
        eval_loss = float(np.mean(losses))
        check_finite(self.step, eval_loss=eval_loss)
        return eval_loss

"""gmp (gradual magnitude pruning) in a MemoryX shard, against cerebras.pytorch's semantics written in torch.

The torch side is independent of weightstream's code: torch.optim.AdamW with cerebras.pytorch's sparsity
hooks as sparse/base.py and sparse/dynamic.py run them (gradients masked, optimizer state pruned before each
step, weights pruned after it, then ``update``: the step count rises, and on an update step the mask is made
again as the top-k magnitudes at the scheduled level, and applied to the weights and their state)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.memoryx_shards import tiny_shard, tiny_sparsity
from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.numerics import ModelDef
from weightstream.numerics.sparse_masks import SparsitySpec
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs
from weightstream.transport.shm import SharedArena

LR = 1e-2


def _params(sparsity: dict[str, Any]) -> dict[str, Any]:
    return {**TINY, "sparsity": {"algorithm": "gmp", "init_method": "topk", **sparsity}}


def _shard(
    raw: dict[str, Any], storage: Path | None
) -> tuple[MemoryXShard, ModelDef, dict[str, SparsitySpec]]:
    shard, model = tiny_shard(raw, timeout_s=2, storage=storage)
    specs = tiny_sparsity(raw, model)
    assert specs is not None
    return shard, model, specs


def _step(shard: MemoryXShard, model: Any, specs: dict, step: int, rng: np.random.Generator) -> dict:
    """One step of random gradients through the shard (sparse ones as values at the kept positions, as a
    worker sends them); returns the dense gradients summed over units."""
    grads: dict[str, np.ndarray] = {}
    for u, unit in enumerate(model.units):
        part = {}
        for n in unit.param_names:
            g = rng.standard_normal(model.specs[n].shape).astype(np.float32)
            part[n] = g.reshape(-1)[shard.sparse.positions(n)] if n in specs else g
            grads[n] = grads[n] + g if n in grads else g
        shard.add_gradient(step, u, part)
    shard.grad_sq_sum(step)
    assert shard.apply_update(step, lr=LR, clip_coef=1.0)
    return grads


class CerebrasGmp:
    """cerebras.pytorch's GMP around torch AdamW, in float32."""

    def __init__(self, weights: dict[str, np.ndarray], sparse: list[str], opt: Any, level: Any, update: Any):
        self.params = {n: torch.tensor(w) for n, w in weights.items()}
        groups = [{"params": [p], "weight_decay": opt.weight_decay_for(n)} for n, p in self.params.items()]
        self.opt = torch.optim.AdamW(groups, lr=LR, betas=opt.betas, eps=opt.eps, foreach=False)
        self.level, self.update, self.step = level, update, 0
        # the initial mask (init_method topk at the level of step 0, when step 0 is an update step)
        self.masks = {
            n: self._topk(n) if update(0) else torch.ones_like(self.params[n], dtype=torch.bool)
            for n in sparse
        }
        for n, m in self.masks.items():
            self.params[n].data.mul_(m)

    def _topk(self, n: str) -> torch.Tensor:
        p = self.params[n]
        density = 1 - torch.clamp(self.level(torch.tensor(self.step)), 0.0, 1.0)
        k = int((density * torch.tensor(p.numel(), dtype=torch.float)).int().item())
        _, idx = torch.topk(p.abs().reshape(-1), k)
        return torch.zeros(p.numel(), dtype=torch.bool).scatter(0, idx, True).reshape(p.shape)

    def train_step(self, grads: dict[str, np.ndarray]) -> None:
        for n, p in self.params.items():
            g = torch.tensor(grads[n])
            p.grad = torch.where(self.masks[n], g, 0.0) if n in self.masks else g
        for n, m in self.masks.items():  # prune_optimizer_states, a step pre-hook
            for s in self.opt.state[self.params[n]].values():
                if s.dim() > 0:
                    s.mul_(m)
        self.opt.step()
        for n, m in self.masks.items():  # step post-hook: prune, then update the masks
            self.params[n].data.mul_(m)
        self.step += 1
        if self.update(self.step):
            for n in self.masks:
                self.masks[n] = self._topk(n)
                self.params[n].data.mul_(self.masks[n])
                for s in self.opt.state[self.params[n]].values():
                    if s.dim() > 0:
                        s.mul_(self.masks[n])


def _linear(init: float, slope: float) -> Any:
    return lambda step: torch.tensor(init) + step * torch.tensor(slope)


def _freq(freq: int, start: int = 0, stop: int | None = None) -> Any:
    def due(step: int) -> bool:
        ok = (step - start) % freq == 0 and step >= start
        return ok and (stop is None or step < stop)

    return due


@pytest.mark.parametrize(
    ("sparsity", "level", "update"),
    [
        (
            {"sparsity": {"type": "linear", "init": 0.3, "slope": 0.1}, "update": {"freq": 2}},
            _linear(0.3, 0.1),
            _freq(2),
        ),
        (
            {
                "schedule": {"type": "linear", "init": 0.1, "slope": 0.1},
                "update": {"freq": 1, "start": 2, "stop": 6},
            },
            _linear(0.1, 0.1),
            _freq(1, 2, 6),
        ),
    ],
    ids=["starts-sparse", "starts-dense"],
)
def test_gmp_follows_cerebras_pytorch(
    rng: np.random.Generator, storage: Path | None, sparsity: dict, level: Any, update: Any
) -> None:
    shard, model, specs = _shard(_params(sparsity), storage)
    theirs = CerebrasGmp(
        {n: shard.dense(n).copy() for n in model.specs}, list(specs), shard.opt, level, update
    )
    for n in specs:  # the same initial masks
        assert np.array_equal(shard.dense(n) != 0, theirs.masks[n].numpy()), n
    for step in range(7):
        theirs.train_step(_step(shard, model, specs, step, rng))
        for n in specs:
            mask = theirs.masks[n].numpy()
            assert np.array_equal(np.sort(np.flatnonzero(mask)), shard.sparse.positions(n)), (step, n)
            assert shard.sparse.nnz[n] == mask.sum()
    for n in model.specs:
        np.testing.assert_allclose(shard.dense(n), theirs.params[n].detach().numpy(), rtol=1e-5, atol=1e-6)
        state = theirs.opt.state[theirs.params[n]]
        for k in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(shard.dense(f"{n}.{k}"), state[k].numpy(), rtol=1e-5, atol=1e-6)
    # the last masks: made at step 6 (level 0.9), and at step 5 (0.6; stop 6) when starting dense
    final = level(torch.tensor(6 if update(6) else 5)).item()
    for n in specs:
        assert shard.sparse.nnz[n] == int(
            (np.float32(1) - np.float32(final)) * np.float32(model.specs[n].numel)
        )


def test_a_falling_level_keeps_entries_again_from_zero(
    rng: np.random.Generator, storage: Path | None
) -> None:
    """A cosine level falls from 0.8 at step 0 to 0.2 at step 4 (masks made at those two steps): the mask
    grows, and the entries kept again start at zero with zero optimizer state, then train."""
    cosine = {"type": "cosine", "init": 0.8, "half_period": 4.0, "minimum": 0.2}
    raw = _params({"sparsity": cosine, "update": {"steps": [0, 4]}})
    shard, model, specs = _shard(raw, storage)
    n = next(iter(specs))
    numel = model.specs[n].numel
    before = set(shard.sparse.positions(n).tolist())
    assert len(before) == int((1 - np.float32(0.8)) * np.float32(numel))
    for step in range(4):
        _step(shard, model, specs, step, rng)
    after = set(shard.sparse.positions(n).tolist())
    level = np.float32(0.3) * np.float32(math.cos(np.float32(4) * np.float32(math.pi / 4))) + np.float32(0.5)
    assert len(after) == int((np.float32(1) - level) * np.float32(numel)) and len(after) > len(before)
    regrown = sorted(after - before)
    w, m = shard.dense(n).reshape(-1), shard.dense(f"{n}.exp_avg").reshape(-1)
    assert not w[regrown].any() and not m[regrown].any()  # made again at step 4: nothing yet
    _step(shard, model, specs, 4, rng)
    assert shard.dense(n).reshape(-1)[regrown].all()  # and the next update moves them


def test_masks_made_again_on_the_shared_memory_plane_hold_no_stale_memfds(rng: np.random.Generator) -> None:
    """With the weights and indexes in memfds (co-located workers map them), each new mask replaces its
    weight's and index's memfds: after every update the shard holds as many as at the start."""
    p = load_params(_params({"sparsity": {"type": "linear", "init": 0.3, "slope": 0.1}}))
    model = model_def(p)
    specs = sparsity_specs(p, model)
    arena = SharedArena("gmp-test")
    shard = MemoryXShard(
        model, optimizer_config(p.optimizer), list(model.specs), 7, 2, arena=arena, sparsity=specs
    )
    try:
        held = len(arena._fds)
        for step in range(4):
            _step(shard, model, specs, step, rng)
            assert len(arena._fds) == held, step
        n = next(iter(specs))
        assert shard.sparse.nnz[n] == int(
            (np.float32(1) - np.float32(0.7)) * np.float32(model.specs[n].numel)
        )
    finally:
        shard.store.close()

"""Loss masks that honour padding: a target of -1 is ignored by the cross-entropy, the denominator is the
counted tokens of the global batch, and the worker's step and the reference trainer both use that count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from tests.params_files import padded_hdf5_params
from weightstream.data import make_data_processor
from weightstream.numerics import forward_backward, forward_loss, init_params
from weightstream.numerics import layers as L
from weightstream.numerics._blocked import for_row_blocks
from weightstream.params import load_params, model_def
from weightstream.training.reference import ReferenceTrainer
from weightstream.worker.engine import Tensors, WorkerEngine

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)
F = torch.nn.functional

B, T, V = 4, 6, 11


def masked_case(rng: np.random.Generator, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Logits [B, T, V] and targets [B, T] with -1 at the end of some rows (padding) and one in the middle."""
    logits = (rng.standard_normal((B, T, V)) * 3).astype(dtype)
    targets = rng.integers(0, V, (B, T))
    targets[1, 4:] = -1
    targets[3, 2:] = -1
    targets[0, 3] = -1
    return logits, targets


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-12, 1e-14), (np.float32, 2e-6, 1e-7)])
def test_masked_cross_entropy_matches_torch_ignore_index(dtype, rtol: float, atol: float, rng) -> None:
    """Loss and gradient equal torch's sum over counted tokens over a denominator from elsewhere (the
    global batch's count: here more than this batch's own)."""
    logits, targets = masked_case(rng, dtype)
    denom = int((targets >= 0).sum()) + 17
    ref = torch.tensor(logits.copy(), requires_grad=True)
    ref_loss = F.cross_entropy(
        ref.reshape(-1, V), torch.as_tensor(targets).reshape(-1), ignore_index=-1, reduction="sum"
    )
    (ref_loss / denom).backward()
    loss, saved = L.cross_entropy_forward(logits, targets, denom)
    grad = L.cross_entropy_backward(saved, logits.shape)
    assert_allclose(loss, ref_loss.item() / denom, rtol=rtol)
    assert_allclose(grad, ref.grad.numpy(), rtol=rtol, atol=atol)
    assert (grad[targets < 0] == 0).all()  # exactly zero, the whole row


def test_any_negative_target_is_ignored(rng) -> None:
    """-100 (torch's default ignore_index) is ignored as -1 is: a negative index never wraps around."""
    logits, targets = masked_case(rng, np.float64)
    other = np.where(targets < 0, -100, targets)
    a, sa = L.cross_entropy_forward(logits, targets, 10)
    b, sb = L.cross_entropy_forward(logits, other, 10)
    assert a == b
    assert_array_equal(L.cross_entropy_backward(sa, logits.shape), L.cross_entropy_backward(sb, logits.shape))


def test_masked_shards_with_the_global_count_add_up_to_the_global_result(rng) -> None:
    logits, targets = masked_case(rng, np.float64)
    denom = int((targets >= 0).sum())
    loss, saved = L.cross_entropy_forward(logits, targets, denom)
    grad = L.cross_entropy_backward(saved, logits.shape)
    for n in (2, 4):
        per = B // n
        parts = [
            L.cross_entropy_forward(logits[i : i + per], targets[i : i + per], denom)
            for i in range(0, B, per)
        ]
        assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-12)
        shard_grads = [L.cross_entropy_backward(p[1], (per, T, V)) for p in parts]
        assert_allclose(np.concatenate(shard_grads), grad, rtol=1e-12, atol=1e-15)


def _unmasked(logits: np.ndarray, targets: np.ndarray, denom: float) -> tuple[float, np.ndarray]:
    """The cross-entropy as it was before masks (forward and backward), to compare bits with."""
    z, tgt = logits.reshape(-1, V), targets.reshape(-1)
    p, token_loss = np.empty_like(z), np.empty(z.shape[0], dtype=np.float64)

    def rows(s: slice) -> None:
        zmax = z[s].max(axis=-1, keepdims=True)
        e = np.subtract(z[s], zmax, out=p[s])
        np.exp(e, out=e)
        sumexp = e.sum(axis=-1, keepdims=True)
        token_loss[s] = (np.log(sumexp) + zmax)[:, 0] - z[s][np.arange(e.shape[0]), tgt[s]]
        e *= 1.0 / sumexp

    for_row_blocks(rows, z.shape[0], V)
    p[np.arange(tgt.shape[0]), tgt] -= 1.0
    p *= p.dtype.type(1.0 / denom)
    return float(token_loss.sum() / denom), p.reshape(logits.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_without_negative_targets_the_bits_are_unchanged(dtype, rng) -> None:
    logits = (rng.standard_normal((B, T, V)) * 3).astype(dtype)
    targets = rng.integers(0, V, (B, T))
    loss, saved = L.cross_entropy_forward(logits, targets, 2 * targets.size)
    want_loss, want_grad = _unmasked(logits, targets, 2 * targets.size)
    assert loss == want_loss
    assert_array_equal(L.cross_entropy_backward(saved, logits.shape), want_grad)


# ---------------------------------------------------------------------------------------------------------
# The worker's step and the reference trainer on padded HDF5 data
# ---------------------------------------------------------------------------------------------------------
WORKERS = 2


class Units:
    """A UnitSource with every weight here: fresh copies out, pushed gradients summed by name."""

    def __init__(self, weights: Tensors, model: Any) -> None:
        self.weights, self.model = weights, model
        self.grads: dict[str, np.ndarray] = {}

    def get_unit(self, step: int, unit: int, phase: int) -> Tensors:
        return {n: self.weights[n].copy() for n in self.model.units[unit].param_names}

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        for n, g in grads.items():
            self.grads[n] = self.grads[n] + g if n in self.grads else g.copy()


class Batches:
    """A BatchSource as the activation server answers: the shard and the global batch's count."""

    def __init__(self, params: Any) -> None:
        self.data = {
            s: make_data_processor(getattr(params, f"{s}_input"), params.model, s) for s in ("train", "eval")
        }

    def get(self, split: str, step: int, worker: int, num_workers: int) -> tuple[np.ndarray, np.ndarray, int]:
        x, y = self.data[split].shard(step, worker, num_workers)
        return x, y, self.data[split].global_tokens(step)


def test_worker_step_and_reference_divide_by_the_global_count_of_counted_tokens(tmp_path: Path) -> None:
    params = load_params(padded_hdf5_params(tmp_path))
    model = model_def(params)
    weights = init_params(model, params.runconfig.seed)
    batches = Batches(params)
    step = 1
    _, y = batches.data["train"].global_batch(step)
    count = int((y >= 0).sum())
    assert 0 < count < y.size  # the data has padding
    ref_loss, ref_grads, tokens = ReferenceTrainer(params, num_shards=WORKERS).gradients(step)
    assert tokens == count
    loss = 0.0
    total: dict[str, np.ndarray] = {}
    for w in range(WORKERS):
        units = Units(weights, model)
        engine = WorkerEngine(model, w, WORKERS, units, batches)
        try:
            outcome = engine.run_step(step)
        finally:
            engine.close()
        x, yw, _ = batches.get("train", step, w, WORKERS)
        want_loss, _ = forward_backward(model, weights, x, yw, count)
        assert outcome.loss == want_loss
        assert outcome.tokens == int((yw >= 0).sum())  # this worker's counted tokens
        loss += outcome.loss
        for n, g in units.grads.items():
            total[n] = total[n] + g if n in total else g
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for n, g in ref_grads.items():
        assert_allclose(total[n], g, rtol=1e-5, atol=1e-7, err_msg=n)
    # one worker over the whole batch: the same mean (the count does not depend on N)
    one, _ = forward_backward(model, weights, *batches.data["train"].global_batch(step), count)
    assert one == pytest.approx(ref_loss, rel=1e-6)


def test_evaluate_divides_by_the_global_count(tmp_path: Path) -> None:
    params = load_params(padded_hdf5_params(tmp_path), overrides={"eval_steps": 2})
    model = model_def(params)
    weights = init_params(model, params.runconfig.seed)
    batches = Batches(params)
    want = []
    for b in range(2):
        x, y = batches.data["eval"].global_batch(b)
        assert (y < 0).any()
        want.append(forward_loss(model, weights, x, y, int((y >= 0).sum())))
    assert ReferenceTrainer(params).evaluate() == pytest.approx(np.mean(want), rel=1e-12)
    total = 0.0
    for w in range(WORKERS):
        engine = WorkerEngine(model, w, WORKERS, Units(weights, model), batches)
        try:
            total += engine.evaluate(0, 2)
        finally:
            engine.close()
    assert total / 2 == pytest.approx(np.mean(want), rel=1e-6)

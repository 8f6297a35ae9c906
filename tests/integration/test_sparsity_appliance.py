"""Weight sparsity end to end: `weightstream run` with ModelZoo's sparsity block, real processes.

The reference is ``ReferenceTrainer``: dense weights times masks, dense gradients masked, an independent
path from the appliance's compact MemoryX storage, compressed wire format and sparse kernels."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file

from tests.integration.appliance import LOSS_RTOL, metrics, resume_copy, run, transformers_loss
from tests.integration.faults import (
    assert_checkpoints_bitwise_equal,
    logged_losses,
    role_pid,
    start_run,
    wait_for_step,
)
from tests.params_files import SPARSE_GPT2
from weightstream.numerics import ModelDef
from weightstream.numerics.sparse import use_sparse_kernels
from weightstream.numerics.sparse_masks import kept_count
from weightstream.params import load_params, model_def
from weightstream.training.reference import ReferenceTrainer
from weightstream.transport.sparse import encode_index


def _write(tmp: Path, **runconfig: Any) -> Path:
    p = json.loads(json.dumps(SPARSE_GPT2))
    p["runconfig"].update(runconfig)
    path = tmp / f"params-{len(list(tmp.glob('params*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _tensors(checkpoint: Path, prefix: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(checkpoint.glob(f"{prefix}*.safetensors")):
        out |= load_file(f)
    return out


def _sparse_kernel_products(model: ModelDef) -> list[str]:
    """The sparse candidates whose products the rule sends through the sparse kernels at 90% sparsity."""
    out = []
    for n in model.sparse_candidates:
        rows, cols = model.specs[n].shape  # a matrix
        if use_sparse_kernels((rows, cols), 0.1):
            out.append(n)
    return out


def _expected_wire_bytes(model: ModelDef, masks: dict[str, np.ndarray], num_csx: int) -> int:
    """Weights in (every unit forward; every unit but the last, kept from forward, backward) and gradients
    out, per step, over ``num_csx`` workers: a sparse weight as fp32 values plus its index, a sparse
    gradient as values alone."""

    def weight(n: str) -> int:
        if n not in masks:
            return 4 * model.specs[n].numel
        kept = np.flatnonzero(masks[n])
        return 4 * len(kept) + len(encode_index(kept, masks[n].size)[1])

    def grad(n: str) -> int:
        return 4 * (int(np.count_nonzero(masks[n])) if n in masks else model.specs[n].numel)

    units = model.units
    forward = sum(weight(n) for u in units for n in u.param_names)
    backward = sum(weight(n) for u in units[:-1] for n in u.param_names)
    return num_csx * (forward + backward + sum(grad(n) for u in units for n in u.param_names))


@pytest.mark.slow  # ~11 s: kept out of the default suite's time; other sparse runs stay in it
def test_sparse_gpt2_trains_on_two_workers_like_the_reference_and_loads_in_transformers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    params_path = _write(tmp_path)
    params = load_params(params_path)
    model = model_def(params)
    sparse_kernels = _sparse_kernel_products(model)
    assert sparse_kernels, "the rule sends none of this model's products through the sparse kernels"
    r = run(params_path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, evals = metrics(tmp_path / "m")
    assert losses[12] < 0.8 * losses[1]  # it learns
    trainer = ReferenceTrainer(params, num_shards=2)
    for step in range(1, 13):
        assert_allclose(losses[step], trainer.train_step().loss, rtol=LOSS_RTOL, err_msg=f"step {step}")
    assert_allclose(evals[12], trainer.evaluate(), rtol=LOSS_RTOL)
    ckpt = tmp_path / "m" / "checkpoint_12"
    weights, masks = _tensors(ckpt, "model"), _tensors(ckpt, "sparsity_masks")
    blocks = [n for n, w in weights.items() if w.ndim == 2 and n.startswith("transformer.h.")]
    # two MemoryX shards: masks in two files, with Hugging Face's index like model and optimizer
    mask_files = {f.name for f in ckpt.glob("sparsity_masks*.safetensors")}
    index = json.loads((ckpt / "sparsity_masks.safetensors.index.json").read_text())
    assert len(mask_files) == 2 and set(index["weight_map"].values()) == mask_files
    assert set(index["weight_map"]) == set(masks)
    assert len(blocks) == 8 and set(masks) == set(blocks)
    for n in blocks:  # at most 10% non-zeros, exactly where the mask keeps
        assert np.count_nonzero(weights[n]) <= 0.1 * weights[n].size, n
        assert not weights[n][~masks[n]].any() and np.count_nonzero(masks[n]) == kept_count(
            weights[n].size, 0.9
        )
        # Adam divides by sqrt(v): float32 differences of tiny gradients move a weight by up to ~1e-3 of
        # an lr step (3e-3); far below what a mask or kernel error would
        assert_allclose(weights[n], trainer.weights[n], rtol=1e-3, atol=2e-5, err_msg=n)
    for n in ("transformer.wte.weight", "transformer.wpe.weight"):
        assert np.count_nonzero(weights[n]) == weights[n].size  # embeddings stay dense
    # only the kept values (and their index) travel: the workers' bytes are exactly what the masks give
    rows = [json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    wire = {r["step"]: r["worker_wire_bytes"] for r in rows if "worker_wire_bytes" in r}
    assert set(wire.values()) == {_expected_wire_bytes(model, masks, num_csx=2)}
    dense_bytes = _expected_wire_bytes(model, {}, num_csx=2)
    assert wire[12] < 0.4 * dense_bytes  # TINY-ish: the dense embeddings weigh a lot here
    assert type(transformers.AutoModelForCausalLM.from_pretrained(ckpt)).__name__ == "GPT2LMHeadModel"
    assert trainer.eval_data is not None
    batches = [trainer.eval_data.global_batch(b) for b in range(params.runconfig.eval_steps)]
    assert_allclose(transformers_loss(ckpt, batches), evals[12], rtol=1e-5)


@pytest.mark.slow  # ~10 s: in .ci/run's slow phase, keeping the default suite short
def test_sparse_runs_are_bitwise_reproducible_across_data_planes_and_masks_survive_resume(
    tmp_path: Path,
) -> None:
    """The same params twice (shared memory, then gRPC as on Kubernetes) give the same bytes; a resume
    from the step-4 checkpoint on one worker, then on four, keeps the masks and the loss curve."""
    a = tmp_path / "a"
    params = _write(tmp_path, max_steps=8, checkpoint_steps=4, data_plane="shared_memory")
    assert run(params, a, "--num_csx", "2").returncode == 0
    b = tmp_path / "b"
    assert (
        run(
            _write(tmp_path, max_steps=8, checkpoint_steps=4, data_plane="grpc"), b, "--num_csx", "2"
        ).returncode
        == 0
    )
    files = sorted(p.name for p in (a / "checkpoint_8").glob("*.safetensors"))
    assert any(f.startswith("sparsity_masks") for f in files)
    for f in files:
        assert (a / "checkpoint_8" / f).read_bytes() == (b / "checkpoint_8" / f).read_bytes(), f
    full, _ = metrics(a)
    for n in ("1", "4"):
        resumed = resume_copy(params, a / "checkpoint_4", tmp_path / f"resumed{n}", n)
        after, _ = metrics(resumed)
        assert sorted(after) == [5, 6, 7, 8]
        for step in after:
            assert_allclose(after[step], full[step], rtol=LOSS_RTOL, err_msg=f"step {step} resumed on {n}")
        masks, original = (
            _tensors(resumed / "checkpoint_8", "sparsity_masks"),
            _tensors(a / "checkpoint_8", "sparsity_masks"),
        )
        assert masks.keys() == original.keys()
        for name, mask in masks.items():
            assert np.array_equal(mask, original[name]), name
        weights = _tensors(resumed / "checkpoint_8", "model")
        for name, mask in masks.items():
            assert not weights[name][~mask].any(), name
        state = _tensors(resumed / "checkpoint_8", "optimizer")
        for name, mask in masks.items():  # pruned entries' optimizer state: zero after four more steps
            assert not state[f"{name}.exp_avg"][~mask].any() and not state[f"{name}.exp_avg_sq"][~mask].any()


# ~11 s; sparse training in memory mode stays in the default run
@pytest.mark.slow
def test_sparse_training_with_disk_memoryx_and_bfloat16_keeps_pruned_weights_zero(tmp_path: Path) -> None:
    p = json.loads(json.dumps(SPARSE_GPT2))
    p["model"]["fp16_type"] = "bfloat16"
    p["runconfig"] |= {"max_steps": 6, "memoryx_storage": "disk"}
    p["sparsity"] = {"sparsity": {"*.mlp.*": 0.95, "*.attn.c_attn.*": 0.5}, "init_method": "topk"}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    r = run(path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, _ = metrics(tmp_path / "m")
    assert losses[6] < losses[1]
    weights = _tensors(tmp_path / "m" / "checkpoint_6", "model")
    masks = _tensors(tmp_path / "m" / "checkpoint_6", "sparsity_masks")
    assert len(masks) == 6  # two blocks x (c_fc, mlp c_proj, c_attn); attn.c_proj matches no glob: dense
    assert np.count_nonzero(weights["transformer.h.0.attn.c_proj.weight"]) == 128 * 128
    for name, mask in masks.items():
        level = 0.95 if ".mlp." in name else 0.5
        assert np.count_nonzero(mask) == kept_count(mask.size, level), name
        assert not weights[name][~mask].any(), name


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["static", "gmp"])
def test_a_sparse_job_survives_a_lost_memoryx_and_worker_bitwise(tmp_path: Path, algorithm: str) -> None:
    """Masks are rebuilt from the recovery snapshot by a replaced MemoryX shard and the worker's index
    structure by a replaced worker: the end result is the fault-free run's, bit for bit (gmp: masks made
    again every few steps, from the snapshot's on, through the replayed steps)."""
    params = _write(tmp_path, max_steps=30, recovery_snapshot_steps=5, rpc_timeout_s=8.0, num_csx=2)
    if algorithm == "gmp":
        raw = yaml.safe_load(params.read_text())
        gmp = {"type": "linear", "init": 0.0, "slope": 0.03}
        raw["sparsity"] = {"algorithm": "gmp", "sparsity": gmp, "update": {"freq": 3}}
        params.write_text(yaml.safe_dump(raw))
    straight = tmp_path / "straight"
    assert run(params, straight, "--num_csx", "2").returncode == 0
    model_dir = tmp_path / "faulty"
    proc = start_run(params, model_dir)
    try:
        for step, role in ((12, "memoryx-1"), (21, "worker-0")):
            wait_for_step(proc, model_dir, step)
            os.kill(role_pid(model_dir, role), signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "restart 2/" in out
    assert_checkpoints_bitwise_equal(model_dir / "checkpoint_30", straight / "checkpoint_30")
    assert any(p.name.startswith("sparsity_masks") for p in (model_dir / "checkpoint_30").iterdir())
    assert logged_losses(model_dir) == logged_losses(straight)


# gmp: dense at first (level 0 at step 0), 0.1 more zeros after every step until step 9 (0.9), then fixed
GMP = {
    "algorithm": "gmp",
    "sparsity": {"type": "linear", "init": 0.0, "slope": 0.1},
    "update": {"freq": 1, "stop": 10},
}


def _write_gmp(tmp: Path) -> Path:
    p = json.loads(json.dumps(SPARSE_GPT2))
    p["sparsity"] = GMP
    p["runconfig"].update(max_steps=12, checkpoint_steps=4)
    path = tmp / "gmp.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def _assert_level(masks: dict[str, np.ndarray], level: float | np.float32) -> None:
    for name, mask in masks.items():
        kept = int((np.float32(1) - np.float32(level)) * np.float32(mask.size))
        assert np.count_nonzero(mask) == kept, (name, level)


def test_gmp_prunes_gradually_through_the_appliance_like_the_reference(tmp_path: Path) -> None:
    """Two workers: every step's loss follows the reference, masks made again from the trained weights
    after each step until step 9; by then the rule has moved the products to the sparse kernels."""
    params_path = _write_gmp(tmp_path)
    params = load_params(params_path)
    model = model_def(params)
    assert _sparse_kernel_products(model)
    r = run(params_path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, _ = metrics(tmp_path / "m")
    trainer = ReferenceTrainer(params, num_shards=2)
    for step in range(1, 13):
        assert_allclose(losses[step], trainer.train_step().loss, rtol=LOSS_RTOL, err_msg=f"step {step}")
        if step == 4:
            _assert_level(_tensors(tmp_path / "m" / "checkpoint_4", "sparsity_masks"), 0.4)
    masks = _tensors(tmp_path / "m" / "checkpoint_12", "sparsity_masks")
    weights = _tensors(tmp_path / "m" / "checkpoint_12", "model")
    assert len(masks) == 8
    _assert_level(masks, np.float32(0.0) + np.float32(9) * np.float32(0.1))  # the last update: step 9
    for name, mask in masks.items():
        assert np.array_equal(mask, trainer.masks[name] > 0), name  # the reference's masks, exactly
        assert not weights[name][~mask].any() and np.count_nonzero(weights[name]) <= 0.1 * mask.size
    assert losses[12] < 0.8 * losses[1]


@pytest.mark.slow  # ~10 s
def test_a_gmp_run_resumed_mid_schedule_on_one_worker_continues_it(tmp_path: Path) -> None:
    """Resumed from step 4 (level 0.4) on one worker: the schedule goes on from there, with the same
    masks and losses as the two-worker run that never stopped."""
    params_path = _write_gmp(tmp_path)
    assert run(params_path, tmp_path / "m", "--num_csx", "2").returncode == 0
    resumed = resume_copy(params_path, tmp_path / "m" / "checkpoint_4", tmp_path / "r", "1")
    full, _ = metrics(tmp_path / "m")
    after, _ = metrics(resumed)
    assert sorted(after) == list(range(5, 13))
    for step in after:
        assert_allclose(after[step], full[step], rtol=LOSS_RTOL, err_msg=f"step {step}")
    masks = _tensors(resumed / "checkpoint_12", "sparsity_masks")
    for name, mask in _tensors(tmp_path / "m" / "checkpoint_12", "sparsity_masks").items():
        assert np.array_equal(masks[name], mask), name

"""The appliance end to end: real processes, real gRPC over loopback, real files, via `weightstream run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose
from safetensors.numpy import load_file

from tests.integration.appliance import (
    LOSS_RTOL,
    checkpoint_weights,
    metrics,
    resume_copy,
    run,
    transformers_loss,
    write_params,
)
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, float], float]:
    params = load_params(write_params(tmp_path_factory.mktemp("ref")))
    trainer = ReferenceTrainer(params, num_shards=1)
    losses = {}
    for _ in range(params.runconfig.max_steps):
        r = trainer.train_step()
        losses[r.step] = r.loss
    return losses, trainer.evaluate()


@pytest.mark.parametrize("num_csx", [1, 2, 4])
def test_loss_curve_matches_reference_for_every_node_count(tmp_path: Path, num_csx: int, reference) -> None:
    ref_losses, ref_eval = reference
    r = run(write_params(tmp_path), tmp_path / "m", "--num_csx", str(num_csx))
    assert r.returncode == 0, r.stderr
    losses, evals = metrics(tmp_path / "m")
    assert sorted(losses) == list(range(1, 9))
    for step, loss in ref_losses.items():
        assert_allclose(losses[step], loss, rtol=LOSS_RTOL, err_msg=f"step {step}, num_csx={num_csx}")
    assert_allclose(evals[8], ref_eval, rtol=LOSS_RTOL)
    assert losses[8] < losses[1]
    for f in ("params.yaml", "run.log", "checkpoint_8/trainer_state.json", "checkpoint_8/config.json"):
        assert (tmp_path / "m" / f).is_file(), f


def test_same_node_count_gives_bitwise_identical_checkpoints(tmp_path: Path) -> None:
    params = write_params(tmp_path, max_steps=4)
    for d in ("a", "b"):
        assert run(params, tmp_path / d, "--num_csx", "2").returncode == 0
    files = sorted(p.name for p in (tmp_path / "a" / "checkpoint_4").iterdir())
    assert "model-00001-of-00002.safetensors" in files and "optimizer.safetensors.index.json" in files
    for f in files:
        if f.endswith(".safetensors"):
            a, b = (tmp_path / d / "checkpoint_4" / f for d in ("a", "b"))
            assert a.read_bytes() == b.read_bytes(), f


@pytest.mark.slow  # ~12-14 s: the default suite stays under ~9 minutes
def test_checkpoint_from_two_nodes_resumes_on_one_and_four(tmp_path: Path) -> None:
    params = write_params(tmp_path, checkpoint_steps=4)
    straight = tmp_path / "straight"
    assert run(params, straight, "--num_csx", "2").returncode == 0
    full, _ = metrics(straight)
    for n in ("1", "4"):
        resumed = resume_copy(params, straight / "checkpoint_4", tmp_path / f"resumed{n}", n)
        after, _ = metrics(resumed)
        assert sorted(after) == [5, 6, 7, 8], "a resumed run continues after the checkpoint's step"
        for step in after:
            assert_allclose(after[step], full[step], rtol=LOSS_RTOL, err_msg=f"step {step} resumed on {n}")


def test_run_is_idempotent_once_done(tmp_path: Path) -> None:
    params = write_params(tmp_path, max_steps=2)
    assert run(params, tmp_path / "m").returncode == 0
    r = run(params, tmp_path / "m")
    assert r.returncode == 0 and "nothing to do" in r.stdout


def test_run_log_holds_steps_and_checkpoints_not_routine_recovery_snapshots(tmp_path: Path) -> None:
    """run.log (and the dashboard's log pane, which shows it) is for the user: every step, evaluation
    and checkpoint, but not the recovery snapshots taken every few steps (here after steps 2 and 4)."""
    params = write_params(tmp_path, max_steps=6, recovery_snapshot_steps=2, checkpoint_steps=3)
    r = run(params, tmp_path / "m")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "m" / "run.log").read_text()
    assert [int(s) for s in re.findall(r" INFO step (\d+) loss ", text)] == [1, 2, 3, 4, 5, 6], text
    assert "INFO step 6 eval_loss" in text and text.count("INFO checkpoint ") == 2, text
    assert "snapshot" not in text and ".recovery_" not in text, text


# ~10 s; HF loading of checkpoints is also checked by the LLaMA and start-from-HF runs
@pytest.mark.slow
def test_checkpoint_loads_into_transformers_with_the_same_loss(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    params_path = write_params(tmp_path, max_steps=3, num_wgt_servers=2)
    assert run(params_path, tmp_path / "m", "--num_csx", "2").returncode == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m" / "checkpoint_3")
    assert type(model).__name__ == "GPT2LMHeadModel"
    # weightstream's own eval of the same weights on the same batches
    params = load_params(params_path)
    trainer = ReferenceTrainer(params)
    for _ in range(3):
        trainer.train_step()
    _, evals = metrics(tmp_path / "m")
    assert_allclose(trainer.evaluate(), evals[3], rtol=LOSS_RTOL)
    assert trainer.eval_data is not None
    batches = [trainer.eval_data.global_batch(b) for b in range(params.runconfig.eval_steps)]
    assert_allclose(transformers_loss(tmp_path / "m" / "checkpoint_3", batches), evals[3], rtol=1e-5)


def test_bad_params_never_start_a_process(tmp_path: Path) -> None:
    params = write_params(tmp_path, num_csx=3)  # batch_size 8 is not divisible by 3
    r = run(params, tmp_path / "m")
    assert r.returncode == 2
    assert "train_input.batch_size: must be divisible by runconfig.num_csx=3" in r.stderr
    assert not (tmp_path / "m").exists()


def _checkpoint_bytes(model_dir: Path, step: int) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((model_dir / f"checkpoint_{step}").glob("*.safetensors"))}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-worker, 4-step run in the default modes, once for every mode compared with it."""
    tmp = tmp_path_factory.mktemp("base")
    r = run(write_params(tmp, max_steps=4), tmp / "base", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    return tmp / "base"


@pytest.mark.parametrize(
    "mode",
    [{"execution_mode": "pipelined"}, {"memoryx_storage": "disk"}, {"data_plane": "grpc"}],
    ids=["pipelined", "disk-backed-memoryx", "grpc-data-plane"],  # the base run uses shared memory
)
def test_modes_that_must_not_change_a_single_bit(
    tmp_path: Path, base_run: Path, mode: dict[str, str]
) -> None:
    base = base_run
    other = tmp_path / "other"
    r = run(write_params(tmp_path, max_steps=4, **mode), other, "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    assert metrics(other)[0] == metrics(base)[0]
    assert _checkpoint_bytes(other, 4) == _checkpoint_bytes(base, 4)
    assert not (other / ".memoryx").exists() or not any(
        (other / ".memoryx").rglob("*.f32")
    )  # scratch removed


def test_micro_batches_accumulate_to_the_same_step(tmp_path: Path, reference) -> None:
    ref_losses, _ = reference
    p = write_params(tmp_path)
    raw = yaml.safe_load(p.read_text())
    raw["train_input"]["micro_batch_size"] = 1  # shards of 4 samples run as 4 micro-batches
    p.write_text(yaml.safe_dump(raw))
    r = run(p, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, _ = metrics(tmp_path / "m")
    for step, loss in ref_losses.items():
        assert_allclose(losses[step], loss, rtol=LOSS_RTOL, err_msg=f"step {step}")


def _recompute_params(tmp: Path, **extra: int) -> Path:
    """A GPT-2 just large enough that ``worker_memory_mb=1`` cannot keep every activation: two workers
    with shards of 16 samples; the memory planner picks micro-batches of 4, and about half of the (unit,
    micro-batch) forwards are recomputed in backward (measured: 8 of 16 on each worker). ``extra``:
    ``worker_memory_mb`` (runconfig) and ``micro_batch_size`` (train_input)."""
    tmp.mkdir(exist_ok=True)
    runconfig = {k: v for k, v in extra.items() if k != "micro_batch_size"}
    p = write_params(tmp, max_steps=3, num_csx=2, **runconfig)
    raw = yaml.safe_load(p.read_text())
    raw["model"].update(hidden_size=64, filter_size=256)
    raw["train_input"]["batch_size"] = 32
    if "micro_batch_size" in extra:
        raw["train_input"]["micro_batch_size"] = extra["micro_batch_size"]
    p.write_text(yaml.safe_dump(raw))
    return p


# the worker's INFO line after its first step (worker/service.py)
_MEMORY_LOG = re.compile(r"micro-batch (\d+), (\d+) unit forward passes recomputed in backward")
# Final weights against the reference: weights are ~0.02 and each AdamW update at most ~lr (<= 2e-3 here);
# float32 rounding of the gradient sums (other order: tree, micro-batches, tied embedding) moves them by
# ~1e-6 at most (measured 1.2e-6); a wrong gradient for one unit moves them by ~lr.
WEIGHT_ATOL = 5e-6


# ~13 s; recompute is unit-tested in tests/unit/worker
@pytest.mark.slow
def test_memory_budget_recomputes_in_backward_and_matches_the_reference(tmp_path: Path) -> None:
    """With a budget that forces micro-batches and recompute-in-backward (checked in the workers' logs),
    the run is the reference's step for step: loss and grad_norm of every step, and the final weights to
    float32 rounding; and bitwise the run with the same micro-batches and no budget (nothing recomputed),
    so the recomputed forward is exactly the one that was not kept."""
    params_path = _recompute_params(tmp_path / "budget_params", worker_memory_mb=1)
    budget = tmp_path / "budget"
    r = run(params_path, budget)
    assert r.returncode == 0, r.stderr
    for w in (0, 1):
        found = _MEMORY_LOG.findall((budget / "logs" / f"worker-{w}.log").read_text())
        assert found, f"worker-{w} logged no micro-batch/recompute line"
        micro, recomputed = (int(v) for v in found[0])
        assert micro < 16 and recomputed > 0, f"worker-{w}: micro-batch {micro}, {recomputed} recomputed"

    trainer = ReferenceTrainer(load_params(params_path), num_shards=1)
    ref = [trainer.train_step() for _ in range(3)]
    lines = (budget / "metrics.jsonl").read_text().splitlines()
    rows = {r["step"]: r for r in map(json.loads, lines) if "loss" in r}  # train rows, not eval rows
    assert sorted(rows) == [1, 2, 3]
    for s in ref:
        assert_allclose(rows[s.step]["loss"], s.loss, rtol=LOSS_RTOL, err_msg=f"loss, step {s.step}")
        # the norm is summed in float64 per tensor: only float32 rounding of the gradients (~1e-8) differs
        assert_allclose(rows[s.step]["grad_norm"], s.grad_norm, rtol=1e-6, err_msg=f"|g|, step {s.step}")
    weights = checkpoint_weights(budget, 3)
    assert sorted(weights) == sorted(trainer.weights)
    for name, weight in trainer.weights.items():
        assert_allclose(weights[name], weight, rtol=1e-5, atol=WEIGHT_ATOL, err_msg=name)

    # the same micro-batches with every activation kept: recompute must not change a bit
    kept = tmp_path / "kept"
    r = run(_recompute_params(tmp_path / "kept_params", micro_batch_size=4), kept)
    assert r.returncode == 0, r.stderr
    assert _MEMORY_LOG.findall((kept / "logs" / "worker-0.log").read_text()) == [("4", "0")]
    assert metrics(kept)[0] == metrics(budget)[0]
    assert _checkpoint_bytes(kept, 3) == _checkpoint_bytes(budget, 3)


def test_memory_budget_too_small_says_why_not(tmp_path: Path) -> None:
    """A budget that cannot hold one sample fails the job with the numbers and the worker's name."""
    p = write_params(tmp_path, max_steps=2, worker_memory_mb=1)
    raw = yaml.safe_load(p.read_text())
    raw["model"].update(hidden_size=512, num_heads=4, filter_size=2048)  # two blocks' weights alone: 24 MiB
    p.write_text(yaml.safe_dump(raw))
    r = run(p, tmp_path / "too_small")
    assert r.returncode == 1
    assert "worker_memory_mb=1 cannot hold a shard" in r.stderr and "worker-0" in r.stderr


def test_bfloat16_on_the_wire_trains_close_to_float32(tmp_path: Path, reference) -> None:
    ref_losses, _ = reference
    p = write_params(tmp_path)
    raw = yaml.safe_load(p.read_text())
    raw["model"]["fp16_type"] = "bfloat16"
    p.write_text(yaml.safe_dump(raw))
    r = run(p, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, _ = metrics(tmp_path / "m")
    assert losses != ref_losses  # bf16 really travelled
    for step, loss in ref_losses.items():
        assert_allclose(losses[step], loss, rtol=2e-2, err_msg=f"step {step}")
    assert losses[8] < losses[1]


def test_a_diverging_run_fails_at_the_step_and_leaves_only_finite_checkpoints(tmp_path: Path) -> None:
    """SGD at learning rate 1e6 without clipping: step 3's gradient norm is NaN. The job fails naming that
    step, applies no update from it, and every checkpoint it wrote (one per step) holds finite values."""
    p = write_params(tmp_path, max_steps=6, checkpoint_steps=1)
    raw = yaml.safe_load(p.read_text())
    raw["optimizer"] = {"optimizer_type": "sgd", "learning_rate": 1.0e6}
    raw["model"]["nonlinearity"] = "gelu_new"  # the tanh form: the gradient norm is NaN at step 3
    p.write_text(yaml.safe_dump(raw))
    r = run(p, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    message = " ".join(r.stderr.split())
    assert "training diverged at step 3" in message and "gradient norm is nan" in message, message
    checkpoints = sorted(d.name for d in (tmp_path / "m").glob("checkpoint_*"))
    assert checkpoints == ["checkpoint_1", "checkpoint_2"]
    for d in checkpoints:
        for f in (tmp_path / "m" / d).glob("*.safetensors"):
            for name, t in load_file(f).items():
                assert np.isfinite(t).all(), f"{d}/{f.name}: {name}"

    def no_constants(c: str) -> float:
        raise AssertionError(f"metrics.jsonl holds {c}")

    rows = (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line, parse_constant=no_constants)["step"] for line in rows] == [1, 2]

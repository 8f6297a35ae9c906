"""Fault recovery's pieces without processes: the restart budget, generation fencing in MemoryX and in the
role host, recovery snapshots' confinement, and metrics trimmed on resume."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest

from tests.memoryx_shards import tiny_shard
from weightstream.backends.base import RoleSpec
from weightstream.checkpoint_layout import confine_checkpoint
from weightstream.plan import JobSpec
from weightstream.role import RoleHost
from weightstream.training.checkpoints import trim_metrics
from weightstream.training.errors import JobFailed
from weightstream.training.recovery import RestartBudget, is_transient
from weightstream.transport.fencing import GENERATION_METADATA, StaleGenerationError

W0, W1, M0 = RoleSpec("worker", 0), RoleSpec("worker", 1), RoleSpec("memoryx", 0)
KILLED = "was killed by SIGKILL"


# -- the restart budget ----------------------------------------------------------------------------------
def test_the_budget_admits_replacements_until_max_role_restarts_then_fails_with_the_history() -> None:
    budget = RestartBudget(max_restarts=2)
    assert budget.admit({W0: f"worker-0 {KILLED}"}, 3, None) == 0.0  # the first replacement: no wait
    budget.step_completed()
    budget.admit({M0: f"memoryx-0 {KILLED}"}, 9, None)
    budget.step_completed()
    with pytest.raises(JobFailed) as e:
        budget.admit({W1: f"worker-1 {KILLED}"}, 20, None)
    text = str(e.value)
    assert "runconfig.max_role_restarts (2)" in text
    # the whole history: which role, at which step, how it died
    assert "step 4: worker-0 worker-0 was killed" in text and "step 10: memoryx-0" in text
    assert "step 21: worker-1" in text
    assert budget.by_kind == {"worker": 1, "memoryx": 1}


def test_a_role_that_dies_again_before_a_step_completes_fails_the_job_instead_of_looping() -> None:
    budget = RestartBudget(max_restarts=50)
    budget.admit({W1: f"worker-1 {KILLED}"}, 5, None)
    budget.admit({W0: f"worker-0 {KILLED}"}, 5, None)  # another role: fine
    with pytest.raises(JobFailed, match="worker-1 failed again before the job completed a step"):
        budget.admit({W1: "worker-1 exited with status 1"}, 5, None)


def test_repeated_replacements_of_one_role_back_off() -> None:
    budget = RestartBudget(max_restarts=50)
    waits = []
    for step in range(6):
        waits.append(budget.admit({W0: f"worker-0 {KILLED}"}, step, None))
        budget.step_completed()
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert budget.admit({W1: f"worker-1 {KILLED}"}, 7, None) == 0.0  # per role


def test_a_replacement_that_trained_ten_steps_has_proven_itself_and_a_new_fault_waits_not() -> None:
    budget = RestartBudget(max_restarts=50)
    assert budget.admit({W0: f"worker-0 {KILLED}"}, 3, None) == 0.0
    for _ in range(9):
        budget.step_completed()
    assert budget.admit({W0: f"worker-0 {KILLED}"}, 12, None) == 0.5  # 9 steps: still a loop
    for _ in range(10):
        budget.step_completed()
    assert budget.admit({W0: f"worker-0 {KILLED}"}, 22, None) == 0.0  # 10 steps on: a new fault
    budget.step_completed()
    assert budget.admit({W0: f"worker-0 {KILLED}"}, 23, None) == 0.5  # and its own loop backs off again


def test_a_failure_with_every_role_alive_is_retried_once_if_transient_and_never_otherwise() -> None:
    budget = RestartBudget(max_restarts=50)
    slow = TimeoutError("workers did not answer within 8s")
    assert budget.admit({}, 4, slow) == 0.0
    with pytest.raises(JobFailed, match="step 5 failed twice with every role alive"):
        budget.admit({}, 4, slow)
    budget = RestartBudget(max_restarts=50)
    bad = RuntimeError("RunStep to worker-0 failed: INVALID_ARGUMENT: ValueError: bad shape")
    with pytest.raises(JobFailed, match="no role was lost"):
        budget.admit({}, 4, bad)
    assert budget.restarts == 0


def test_transient_errors_are_the_ones_a_new_attempt_may_cure() -> None:
    assert is_transient(RuntimeError("GetUnit to swarmx-0 failed: UNAVAILABLE: connection refused"))
    assert is_transient(RuntimeError("ABORTED: call of generation 1 refused"))
    assert not is_transient(RuntimeError("PERMISSION_DENIED: not this job's checkpoint"))


# -- generation fencing in a MemoryX shard ------------------------------------------------------------------
def _grads(model: Any, unit: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {n: np.full(model.specs[n].shape, value, np.float32) for n in model.units[unit].param_names}


def test_a_reset_shard_drops_the_interrupted_step_and_refuses_its_stragglers() -> None:
    shard, model = tiny_shard(timeout_s=5)
    before = {n: w.copy() for n, w in shard.tensors(0, list(model.specs))}
    shard.add_gradient(0, 0, _grads(model, 0, 100.0), generation=0)  # the first attempt, interrupted
    shard.reset(1)
    with pytest.raises(StaleGenerationError, match="generation 0 refused"):
        shard.add_gradient(0, 1, _grads(model, 1, 100.0), generation=0)  # still in flight: refused
    with pytest.raises(StaleGenerationError):
        shard.apply_update(0, 1e-3, 1.0, generation=0)
    for u in range(len(model.units)):  # the re-run: every unit once, unit 0 again included
        shard.add_gradient(0, u, _grads(model, u), generation=1)
    assert shard.apply_update(0, 1e-3, 1.0, generation=1)
    # the weights equal a shard that only ever saw the re-run's gradients
    clean, _ = tiny_shard(timeout_s=5)
    for u in range(len(model.units)):
        clean.add_gradient(0, u, _grads(model, u))
    clean.apply_update(0, 1e-3, 1.0)
    for n, w in shard.tensors(1, list(model.specs)):
        assert np.array_equal(w, dict(clean.tensors(1, [n]))[n])
        assert not np.array_equal(w, before[n]) or n.endswith("bias")


def test_a_norm_waiting_in_the_old_generation_gives_up_at_the_reset() -> None:
    shard, _ = tiny_shard(timeout_s=5)
    errors: list[BaseException] = []

    def wait_norm() -> None:
        try:
            shard.grad_sq_sum(0, generation=0)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=wait_norm)
    t0 = time.monotonic()
    t.start()
    assert shard.progress.wait_for_waiters(1, timeout_s=5), "the norm must wait for the missing gradients"
    shard.reset(1)
    t.join(timeout=5)
    assert time.monotonic() - t0 < 3  # not the 5 s timeout
    assert len(errors) == 1 and isinstance(errors[0], StaleGenerationError)


# -- the role host: reconfiguration and the generation check ------------------------------------------------
class _Context:
    def __init__(self, generation: int | None) -> None:
        self.md = [] if generation is None else [(GENERATION_METADATA, str(generation))]
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.md

    def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError(details)


def _servicer(ctx: _Context) -> grpc.ServicerContext:
    """``ctx`` where RoleHost.logic takes a ``grpc.ServicerContext``: it has the methods logic calls."""
    return cast(grpc.ServicerContext, ctx)


class _Logic:
    def __init__(self, job: JobSpec) -> None:
        self.job, self.closed = job, False

    def close(self) -> None:
        self.closed = True


def _job(generation: int, keep: bool = False) -> JobSpec:
    return JobSpec({}, {}, {}, "worker", 0, generation=generation, keep_state=keep)


def test_the_host_rebuilds_its_logic_per_generation_and_refuses_other_generations() -> None:
    host = RoleHost("worker", _Logic, "0" * 64)
    host.configure(_job(0))
    first = host.logic(_servicer(_Context(None)))  # no metadata: generation 0
    host.configure(_job(1))
    second = host.logic(_servicer(_Context(1)))
    assert second is not first and first.closed and not second.closed
    ctx = _Context(0)
    with pytest.raises(RuntimeError, match="generation 0 refused"):
        host.logic(_servicer(ctx))
    assert ctx.aborted is not None and ctx.aborted[0] == grpc.StatusCode.ABORTED


def test_a_reconfigure_hook_keeps_the_logic() -> None:
    kept: list[JobSpec] = []

    def keep(old: _Logic, job: JobSpec) -> _Logic | None:
        kept.append(job)
        return old if job.keep_state else None

    host = RoleHost("worker", _Logic, "0" * 64, keep)
    host.configure(_job(0))
    first = host.logic(_servicer(_Context(0)))
    host.configure(_job(1, keep=True))
    assert host.logic(_servicer(_Context(1))) is first and not first.closed
    host.configure(_job(2, keep=False))
    assert host.logic(_servicer(_Context(2))) is not first and first.closed
    assert [j.generation for j in kept] == [1, 2]


# -- recovery snapshots and metrics ------------------------------------------------------------------------
def test_recovery_snapshots_are_resumable_only_inside_the_job(tmp_path: Path) -> None:
    (tmp_path / "m" / ".recovery_10").mkdir(parents=True)
    assert confine_checkpoint(tmp_path / "m", tmp_path / "m" / ".recovery_10").name == ".recovery_10"
    (tmp_path / "other" / ".recovery_10").mkdir(parents=True)
    for bad in (tmp_path / "other" / ".recovery_10", tmp_path / "m" / ".recovery_x"):
        with pytest.raises(PermissionError):
            confine_checkpoint(tmp_path / "m", bad)


def test_a_resumed_run_drops_the_metrics_of_the_steps_it_does_again(tmp_path: Path) -> None:
    f = tmp_path / "metrics.jsonl"
    records = [{"step": s, "loss": 1.0 / s} for s in range(1, 8)] + [{"step": 5, "eval_loss": 0.5}]
    f.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 8, "lo')  # torn by a crash
    assert trim_metrics(f, 5) == 3  # steps 6 and 7, and the torn line
    kept = [json.loads(line) for line in f.read_text().splitlines()]
    assert [r["step"] for r in kept] == [1, 2, 3, 4, 5, 5]
    assert trim_metrics(f, 5) == 0

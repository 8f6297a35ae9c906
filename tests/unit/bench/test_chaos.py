"""bench/chaos.py: its fault schedule, the arithmetic of its summary, and the comparison of two runs'
checkpoints; the smoke run end to end is in tests/integration/bench/test_chaos.py."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.bench_module import load_bench
from weightstream.plan import REPLICA
from weightstream.training.events import JobEvent, RecoveredEvent, RestartEvent, StepEvent
from weightstream.training.records import StepRecord
from weightstream.training.runner import RunSummary

COUNTS = {"memoryx": 2, "swarmx": 1, "activation": 1, "worker": 2}


def _load() -> ModuleType:
    return load_bench("chaos")


chaos = _load()


def test_default_schedule_hits_every_kind_spaced_with_memoryx_first_and_one_stop() -> None:
    s = chaos.fault_schedule(200, 20, COUNTS, first_recovery_point=10)
    assert len(s) == 20
    assert s[0].kind == "memoryx" and 1 <= s[0].after_step < 10  # before any snapshot: a seed rollback
    assert {i.kind for i in s} == set(chaos.KINDS) - {REPLICA}  # the job has none
    roles = [f"{kind}-{i}" for kind, n in COUNTS.items() for i in range(n)]
    assert sorted({i.role for i in s}) == sorted(roles)
    stops = [i for i in s if i.signal == "SIGSTOP"]
    assert len(stops) == 1 and stops[0].kind == "worker"
    steps = [i.after_step for i in s]
    assert all(b - a >= 2 for a, b in itertools.pairwise(steps))
    assert steps[-1] <= 200 - 2
    # a role is never hit twice in a row: its replacement serves steps before it is hit again
    assert all(a.role != b.role for a, b in itertools.pairwise(s))


def test_a_job_with_replicas_has_its_replicas_struck_too() -> None:
    s = chaos.fault_schedule(200, 20, {**COUNTS, REPLICA: 2}, first_recovery_point=10)
    assert [i.kind for i in s[:5]] == ["memoryx", "swarmx", "activation", "worker", REPLICA]
    assert {i.role for i in s if i.kind == REPLICA} == {f"{REPLICA}-0", f"{REPLICA}-1"}


@pytest.mark.parametrize(
    ("steps", "faults", "first", "match"),
    [
        (200, 3, 10, "at least 4"),
        (200, 20, 1, "no room for a MemoryX kill"),
        (30, 20, 10, "fewer than 2"),
    ],
)
def test_schedule_refuses_what_cannot_work(steps: int, faults: int, first: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        chaos.fault_schedule(steps, faults, COUNTS, first_recovery_point=first)


def test_cost_per_fault_is_the_added_wall_time_per_fault_in_fault_free_steps() -> None:
    assert chaos.cost_per_fault_steps(130.0, 100.0, 10, 1.5) == pytest.approx(2.0)


def _checkpoint(d: Path, w: np.ndarray) -> Path:
    d.mkdir(parents=True)
    save_file({"w": w, "b": np.zeros(3, np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"w.m": w * 2}, str(d / "optimizer-00001-of-00002.safetensors"))
    return d


def test_checkpoints_equal_means_every_tensor_bit_for_bit(tmp_path: Path) -> None:
    w = np.linspace(0, 1, 6, dtype=np.float32)
    a = _checkpoint(tmp_path / "a", w)
    assert chaos.checkpoints_equal(a, _checkpoint(tmp_path / "b", w.copy()))
    nudged = w.copy()
    nudged[3] = np.nextafter(nudged[3], np.float32(2))  # one ulp
    assert not chaos.checkpoints_equal(a, _checkpoint(tmp_path / "c", nudged))
    assert not chaos.checkpoints_equal(a, _checkpoint(tmp_path / "d", w.astype(np.float64)))
    missing = _checkpoint(tmp_path / "e", w)
    (missing / "optimizer-00001-of-00002.safetensors").unlink()
    assert not chaos.checkpoints_equal(a, missing)


def _run(tmp: Path, name: str, wall: float, events: list[tuple[float, JobEvent]], losses: list[float]) -> Any:
    model_dir = tmp / name
    ckpt = _checkpoint(model_dir / "checkpoint_2", np.ones(6, np.float32))
    rows = [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]
    (model_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = RunSummary(
        2, 0, 2, losses[-1], None, ckpt, wall, sum(isinstance(e, RestartEvent) for _, e in events)
    )
    return chaos.Run(model_dir, wall, summary, events)


def _step(step: int, step_time_s: float = 1.0) -> StepEvent:
    record = StepRecord(step, 1.0, 1e-3, 1.0, 16, step_time_s, 0.0, 0.0, 0.0, 0, 0)
    return StepEvent(record, tokens_per_second=16.0, max_steps=100)


def _steps(*at: float) -> list[tuple[float, JobEvent]]:
    """Step events at the times ``at`` (seconds), each step taking 1 s."""
    return [(t, _step(n + 1)) for n, t in enumerate(at)]


def _restart(role: str, step: int = 2) -> RestartEvent:
    return RestartEvent(role, role.rsplit("-", 1)[0], step, f"{role} was killed", 1, 50)


def _recovered(step: int, replay_steps: int, recovery_s: float) -> RecoveredEvent:
    return RecoveredEvent(step, replay_steps, recovery_s, generation=1, restarts=1, addresses={})


def test_summary_from_the_events_of_both_runs(tmp_path: Path) -> None:
    # the first step warms up: not in the median
    base_steps: list[tuple[float, JobEvent]] = [(1.0, _step(1, step_time_s=3.0)), (2.0, _step(2))]
    base = _run(tmp_path, "base", 10.0, base_steps, [5.0, 4.0])
    events = [
        *_steps(
            10.0, 14.0, 15.0, 16.0, 32.0, 33.5
        ),  # gaps 1, 1, 1.5 s (median 1); 4 s and 16 s around faults
        (11.0, _restart("memoryx-0")),
        (12.0, _recovered(0, replay_steps=1, recovery_s=0.5)),
        (30.2, _restart("worker-0")),
        (31.0, _recovered(4, replay_steps=0, recovery_s=1.5)),
        (34.5, _restart("memoryx-1")),  # no injection of ours: detects nothing
    ]
    faulty = _run(tmp_path, "faulty", 30.0, sorted(events, key=lambda te: te[0]), [5.0, 4.0])
    faulty.injected = [
        (10.5, chaos.Injection(1, "memoryx-0", "SIGKILL"), 11),
        (16.2, chaos.Injection(4, "worker-0", "SIGSTOP"), 12),  # found by the RPC deadline
        (34.0, chaos.Injection(6, "activation-0", "SIGKILL"), 13),  # never detected, no step after it
    ]
    s = chaos.summarize(base, faulty)
    assert s["faults"]["by_kind"] == {"memoryx": 1, "swarmx": 0, "activation": 1, "worker": 1, REPLICA: 0}
    assert s["faults"]["by_signal"] == {"SIGKILL": 2, "SIGSTOP": 1}
    assert s["restarts"] == 3 and s["restarts_by_kind"] == {
        "memoryx": 2,
        "swarmx": 0,
        "activation": 0,
        "worker": 1,
        REPLICA: 0,
    }
    assert s["recovery_s_total"] == 2.0 and s["replay_steps_total"] == 1
    assert s["detection_s_sigkill_median"] == 0.5 and s["detection_s_sigstop"] == 14.0
    assert s["undetected_faults"] == 1
    assert s["lost_s_per_sigkill_by_kind"] == {
        "memoryx": 3.0,
        "swarmx": None,
        "activation": None,
        "worker": None,
        REPLICA: None,
    }
    assert s["lost_s_sigstop"] == 15.0
    assert s["cost_per_fault_in_steps_in_run"] == 9.0  # (3 + 15) / 2 faults followed by a step / 1 s
    assert s["slowdown"] == 3.0
    assert s["fault_free_step_s_median"] == 1.0 and s["fault_free_step_s_mean"] == 2.0
    assert s["step_s_ratio_faulty_over_fault_free"] == 1.0
    assert s["cost_per_fault_in_steps"] == pytest.approx((30.0 - 10.0) / 3 / 2.0, abs=0.01)
    assert s["cost_per_fault_target_met"] == {"wall": False, "in_run": False}
    assert s["bitwise_equal"] is True and s["losses_equal"] is True
    (faulty.model_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.5}\n')
    assert chaos.summarize(base, faulty)["losses_equal"] is False

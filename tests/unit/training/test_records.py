"""A run's records and events as they leave the process (training/records.py, events.py,
metrics_writer.py): the exact JSON of ``metrics.jsonl`` and of each event, key for key and in order, as a
run of the appliance writes them (the expected lines are a real run's, with its numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightstream.training import events
from weightstream.training.events import (
    CheckpointEvent,
    EvalEvent,
    JobEvent,
    RecoveredEvent,
    RestartEvent,
    ResumingEvent,
    RetryEvent,
    RunningEvent,
    StartingEvent,
    StartingFromEvent,
    StatusEvent,
    StepEvent,
    StragglerEvent,
    WorkersEvent,
)
from weightstream.training.metrics_writer import MetricsWriter
from weightstream.training.records import EvalRecord, SampleRates, StepMetrics, StepRecord

RECORD = StepRecord(
    step=2,
    loss=4.167198294773698,
    learning_rate=0.001,
    grad_norm=0.9565651755112154,
    tokens=112,
    step_time_s=0.051502461999916704,
    worker_wait_s=1.1135766849984066,
    worker_compute_s=0.011468573004094651,
    update_s=0.0033972290002566297,
    worker_peak_rss_bytes=218869760,
    worker_wire_bytes=252672,
    workers=2,
    slowest_worker=1,
    slowest_worker_ratio=1.0433873590311127,
    slowest_worker_lag_s=0.0004779150034300983,
)
RATES = SampleRates(local_samples_per_sec=8.151412536771526, avg_samples_per_sec=8.151412536771526)
TOKENS_PER_SECOND = 130.46094208818167

STEP_LINE = (
    '{"step": 2, "loss": 4.167198294773698, "learning_rate": 0.001, "grad_norm": 0.9565651755112154, '
    '"step_time_s": 0.051502461999916704, "worker_wait_s": 1.1135766849984066, '
    '"worker_compute_s": 0.011468573004094651, "update_s": 0.0033972290002566297, '
    '"worker_peak_rss_bytes": 218869760, "worker_wire_bytes": 252672, "workers": 2, "slowest_worker": 1, '
    '"slowest_worker_ratio": 1.0433873590311127, "slowest_worker_lag_s": 0.0004779150034300983, '
    '"tokens_per_second": 130.46094208818167, "local_samples_per_sec": 8.151412536771526, '
    '"avg_samples_per_sec": 8.151412536771526}'
)
EVAL_LINE = '{"step": 3, "eval_loss": 4.158126917667687}'

ADDRESSES = {"activation": ["127.0.0.1:38033"], "memoryx": ["127.0.0.1:41941", "127.0.0.1:44011"]}
ADDRESSES_JSON = '{"activation": ["127.0.0.1:38033"], "memoryx": ["127.0.0.1:41941", "127.0.0.1:44011"]}'
REASON = "memoryx-0 (pid 12888) was killed by SIGKILL; its log: /m/logs/memoryx-0.log"

# each event, and its ``to_dict()`` as JSON
EVENTS: list[tuple[JobEvent, str]] = [
    (
        StartingEvent(roles={"memoryx": 2, "swarmx": 1, "activation": 1, "worker": 1}),
        '{"event": "status", "status": "starting", '
        '"roles": {"memoryx": 2, "swarmx": 1, "activation": 1, "worker": 1}}',
    ),
    (
        StartingFromEvent(checkpoint="/hf/gpt2", step=0),
        '{"event": "status", "status": "starting_from", "checkpoint": "/hf/gpt2", "step": 0}',
    ),
    (
        ResumingEvent(checkpoint="/m/checkpoint_6", step=6),
        '{"event": "status", "status": "resuming", "checkpoint": "/m/checkpoint_6", "step": 6}',
    ),
    (
        RunningEvent(addresses=ADDRESSES),
        f'{{"event": "status", "status": "running", "addresses": {ADDRESSES_JSON}}}',
    ),
    (
        StepEvent(RECORD, tokens_per_second=TOKENS_PER_SECOND, max_steps=6),
        '{"event": "step", "step": 2, "loss": 4.167198294773698, "learning_rate": 0.001, '
        '"grad_norm": 0.9565651755112154, "step_time_s": 0.051502461999916704, '
        '"worker_wait_s": 1.1135766849984066, "worker_compute_s": 0.011468573004094651, '
        '"update_s": 0.0033972290002566297, "worker_peak_rss_bytes": 218869760, "worker_wire_bytes": 252672, '
        '"workers": 2, "slowest_worker": 1, "slowest_worker_ratio": 1.0433873590311127, '
        '"slowest_worker_lag_s": 0.0004779150034300983, "tokens_per_second": 130.46094208818167, '
        '"max_steps": 6}',
    ),
    (
        EvalEvent(step=3, eval_loss=4.158126917667687),
        '{"event": "eval", "step": 3, "eval_loss": 4.158126917667687}',
    ),
    (
        CheckpointEvent(step=3, path="/m/checkpoint_3"),
        '{"event": "checkpoint", "step": 3, "path": "/m/checkpoint_3"}',
    ),
    (
        RestartEvent(
            role="memoryx-0",
            role_kind="memoryx",
            step=5,
            reason=REASON,
            restarts=1,
            max_role_restarts=50,
        ),
        '{"event": "restart", "role": "memoryx-0", "role_kind": "memoryx", "step": 5, '
        f'"reason": "{REASON}", "restarts": 1, "max_role_restarts": 50, "fault": "died", "host": ""}}',
    ),
    (
        RetryEvent(step=5, reason="DEADLINE_EXCEEDED: worker-0 RunStep"),
        '{"event": "retry", "step": 5, "reason": "DEADLINE_EXCEEDED: worker-0 RunStep"}',
    ),
    (
        RecoveredEvent(
            step=3,
            replay_steps=1,
            recovery_s=0.9163870599986694,
            generation=1,
            restarts=1,
            addresses=ADDRESSES,
        ),
        '{"event": "recovered", "step": 3, "replay_steps": 1, "recovery_s": 0.9163870599986694, '
        f'"generation": 1, "restarts": 1, "addresses": {ADDRESSES_JSON}, "action": ""}}',
    ),
    (
        WorkersEvent(
            step=6, from_workers=3, to_workers=2, reason="no capacity to start worker-1 again within 2s"
        ),
        '{"event": "workers", "step": 6, "from_workers": 3, "to_workers": 2, '
        '"reason": "no capacity to start worker-1 again within 2s"}',
    ),
    (
        StragglerEvent(step=12, worker="worker-1", host="h2", ratio=4.212046384811401, steps=3),
        '{"event": "straggler", "step": 12, "worker": "worker-1", "host": "h2", "ratio": 4.212046384811401, '
        '"steps": 3}',
    ),
]


def test_a_logged_steps_line_is_the_files_format() -> None:
    line = StepMetrics(RECORD, TOKENS_PER_SECOND, RATES)
    assert json.dumps(line.to_dict()) == STEP_LINE
    assert "tokens" not in RECORD.to_dict()  # the run's throughput counts them; the file does not


def test_an_evaluations_line_is_the_files_format() -> None:
    assert json.dumps(EvalRecord(3, 4.158126917667687).to_dict()) == EVAL_LINE


def test_the_writer_appends_each_line_to_metrics_jsonl(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "eval_loss": 4.2}\n')  # an earlier run's
    clock = iter([0.0, 1.0]).__next__  # the run's start, then step 2's rates: 8 samples in 1 s
    with MetricsWriter(tmp_path, 1, 8, with_eval=True, clock=clock) as writer:
        line = writer.step(RECORD, TOKENS_PER_SECOND)
        writer.eval(EvalRecord(3, 4.158126917667687))
    assert line.rates == SampleRates(local_samples_per_sec=8.0, avg_samples_per_sec=8.0)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == ['{"step": 1, "eval_loss": 4.2}', json.dumps(line.to_dict()), EVAL_LINE]


@pytest.mark.parametrize(("event", "expected"), EVENTS, ids=[type(e).__name__ for e, _ in EVENTS])
def test_each_event_is_the_json_it_always_was(event: JobEvent, expected: str) -> None:
    assert json.dumps(event.to_dict()) == expected
    # what the job service stores as the event's data (under its kind): the same, without "event"
    wire = json.loads(expected)
    assert wire.pop("event") == event.kind
    assert json.dumps(event.data()) == json.dumps(wire)


def test_every_event_class_is_covered() -> None:
    exported = {getattr(events, name) for name in events.__all__}
    kinds = {c for c in exported if isinstance(c, type) and issubclass(c, JobEvent)} - {JobEvent, StatusEvent}
    assert kinds == {type(e) for e, _ in EVENTS}

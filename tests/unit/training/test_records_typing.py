"""A step's record, a run's state and a job's events are typed end to end: a misspelled or renamed field
where they are read, made or matched fails type checking (mypy), not a run. One mypy run over a consumer
written the way ours are (console.py, runner.py, bench/chaos.py): each line marked ``# error: <code>``
must be reported with that code, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# pinned in pyproject.toml's test extra; without it the check cannot run, and says so
mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed: pip install 'weightstream[test]'")

SERVICES = Path(__file__).parents[3] / "services"

CONSUMER = """
from pathlib import Path

from weightstream.training.events import JobEvent, RestartEvent, StepEvent
from weightstream.training.records import StepRecord
from weightstream.training.run_state import RunState


def loss_of(e: StepEvent) -> float:
    return e.record.loss


def misspelled_read(e: StepEvent) -> float:
    return e.record.los  # error: attr-defined


def made(step: int) -> StepRecord:
    return StepRecord(step, 1.0, 0.0, 1.0, 16, 0.1, 0.0, 0.1, 0.0, 0, 0)


def misspelled_keyword() -> StepRecord:
    return StepRecord(  # error: call-arg
        step=1,
        los=1.0,
        learning_rate=0.0,
        grad_norm=1.0,
        tokens=16,
        step_time_s=0.1,
        worker_wait_s=0.0,
        worker_compute_s=0.1,
        update_s=0.0,
        worker_peak_rss_bytes=0,
        worker_wire_bytes=0,
    )


def matched(e: JobEvent) -> float:
    match e:
        case StepEvent(record=StepRecord(loss=loss)):
            return loss
        case StepEvent(record=StepRecord(los=loss)):  # error: misc
            return loss
        case RestartEvent():
            return e.restarts + e.max_role_restarts
    return 0.0


def renamed(e: RestartEvent) -> int:
    return e.restart  # error: attr-defined


def not_narrowed(e: JobEvent) -> int:
    return e.step  # error: attr-defined


def state(s: RunState) -> None:
    s.eval_loss = 1.0
    s.eval_los = 1.0  # error: attr-defined
    s.recovery_point = (s.done, Path("checkpoint_4"))
"""


def test_a_misspelled_field_fails_type_checking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "consumer.py"
    source.write_text(CONSUMER)
    monkeypatch.setenv("MYPYPATH", str(SERVICES))  # our packages, as the code itself imports them
    args = [
        str(source),
        "--follow-imports=silent",  # only the consumer's errors: ours are what it reads
        "--cache-dir",
        str(tmp_path / "mypy_cache"),
        "--no-error-summary",
        "--hide-error-context",
        "--show-error-codes",
    ]
    out, err, _ = mypy_api.run(args)
    found = {
        int(m["line"]): m["code"]
        for m in re.finditer(r"^.*consumer\.py:(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$", out, re.M)
    }
    expected = {
        n: m.group(1)
        for n, text in enumerate(CONSUMER.splitlines(), start=1)
        if (m := re.search(r"# error: ([\w-]+)$", text))
    }
    assert len(expected) == 6
    assert found == expected, f"mypy said:\n{out}{err}"

"""TensorBoard event files, as a user reads them: `weightstream run` writes ModelZoo's ``train/`` and
``eval/`` with the same steps and values as ``metrics.jsonl``; a resumed run and a run that recovers from a
lost MemoryX shard show every step once. Read back with TensorBoard's own EventAccumulator (what the UI shows)
and, for duplicates, record by record from the files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from tests.integration.appliance import TINY, run, weightstream_cmd, write_params
from tests.waiting import wait_until
from weightstream.training.records import SampleRates, StepMetrics, StepRecord
from weightstream.training.tensorboard import TRAIN_SCALARS, RunEvents

BATCH = TINY["train_input"]["batch_size"]
RATES = ("local_samples_per_sec", "avg_samples_per_sec", "avg_steps_per_sec")
MODELZOO_TRAIN_SCALARS = ("loss", "lr", "grad_norm", *RATES)  # the names ModelZoo's train/ has


def _rows(model_dir: Path) -> tuple[dict[int, dict[str, Any]], dict[int, float]]:
    """(training record by step, eval loss by step) from metrics.jsonl; a step twice fails the test."""
    train: dict[int, dict[str, Any]] = {}
    evals: dict[int, float] = {}
    for line in (model_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["step"] not in (evals if "eval_loss" in r else train), f"step {r['step']} twice"
        if "eval_loss" in r:
            evals[r["step"]] = r["eval_loss"]
        else:
            train[r["step"]] = r
    return train, evals


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series as TensorBoard shows it: (step, value) in order, purges applied."""
    if not log_dir.is_dir():
        return {}
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _records(log_dir: Path) -> list[tuple[str, int]]:
    """(tag, step) of every scalar written into ``log_dir``'s files, purges not applied."""
    return [
        (v.tag, e.step)
        for f in sorted(log_dir.glob("events.out.tfevents.*"))
        for e in LegacyEventFileLoader(str(f)).Load()
        for v in e.summary.value
    ]


def _line(step: int, loss: float, rates: SampleRates, learning_rate: float = 0.1) -> StepMetrics:
    """A logged step's metrics line: its loss and rates as given, the rest fixed."""
    record = StepRecord(step, loss, learning_rate, 1.0, 16, 0.5, 0.0, 0.5, 0.0, 0, 0)
    return StepMetrics(record, tokens_per_second=32.0, rates=rates)


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _assert_events_match_metrics(model_dir: Path) -> None:
    """train/ and eval/ hold the steps of metrics.jsonl, each once, with its values as float32."""
    train, evals = _rows(model_dir)
    shown = _scalars(model_dir / "train")
    assert set(shown) == set(MODELZOO_TRAIN_SCALARS)
    for field, tag in TRAIN_SCALARS.items():
        assert [s for s, _ in shown[tag]] == sorted(train), f"{tag}: steps differ from metrics.jsonl"
        for step, value in shown[tag]:
            assert _f32(value) == _f32(train[step][field]), f"{tag} at step {step}"
    for step, value in shown["avg_steps_per_sec"]:
        assert value == pytest.approx(train[step]["avg_samples_per_sec"] / BATCH, rel=1e-6)
    for tag in RATES:
        assert all(v > 0 for _, v in shown[tag]), tag
    eval_shown = _scalars(model_dir / "eval")["loss"]
    assert [s for s, _ in eval_shown] == sorted(evals)
    for step, value in eval_shown:
        assert _f32(value) == _f32(evals[step]), f"eval loss at step {step}"


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 6 steps: evaluated at 2, 4, 6; checkpoints 4 and 6."""
    tmp = tmp_path_factory.mktemp("six")
    r = run(write_params(tmp, max_steps=6, eval_frequency=2, checkpoint_steps=4), tmp / "m")
    assert r.returncode == 0, r.stderr
    return tmp / "m"


def test_event_files_hold_the_metrics_step_for_step(six_steps: Path) -> None:
    _assert_events_match_metrics(six_steps)
    train, evals = _rows(six_steps)
    assert sorted(train) == [1, 2, 3, 4, 5, 6] and sorted(evals) == [2, 4, 6]
    # metrics.jsonl has the rates too. Logged every step, each local rate's window (BATCH samples) holds
    # that step, and the windows add up to the run's time, which the average rate covers
    windows = [BATCH / train[s]["local_samples_per_sec"] for s in sorted(train)]
    assert all(w >= train[s]["step_time_s"] for s, w in zip(sorted(train), windows, strict=True))
    assert sum(windows) == pytest.approx(6 * BATCH / train[6]["avg_samples_per_sec"], rel=1e-9)


def test_a_resumed_run_shows_every_step_once_with_its_own_values(six_steps: Path, tmp_path: Path) -> None:
    """An earlier attempt logged and evaluated up to step 6, but its last checkpoint is 4 (checkpoint_6 is
    gone): the run resumes from 4 with another learning rate, so steps 5 and 6 get new values."""
    model_dir = tmp_path / "m"
    shutil.copytree(six_steps, model_dir)
    shutil.rmtree(model_dir / "checkpoint_6")
    params = json.loads(json.dumps(TINY))
    params["optimizer"]["learning_rate"][1]["end_learning_rate"] = 1.0e-3
    params["runconfig"].update(max_steps=8, eval_frequency=2, checkpoint_steps=4)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = run(tmp_path / "params.yaml", model_dir)
    assert r.returncode == 0, r.stderr
    assert "resuming from" in (model_dir / "run.log").read_text()
    _assert_events_match_metrics(model_dir)
    before, evals_before = _rows(six_steps)
    after, evals_after = _rows(model_dir)
    assert sorted(after) == list(range(1, 9)) and sorted(evals_after) == [2, 4, 6, 8]
    # the resumed run's values, not the earlier attempt's, for the steps after the checkpoint
    assert after[5]["learning_rate"] != before[5]["learning_rate"]
    assert evals_after[6] != evals_before[6]
    assert all(after[s]["loss"] == before[s]["loss"] for s in (1, 2, 3, 4))  # kept from the first run
    assert len(list((model_dir / "eval").glob("events.out.tfevents.*"))) == 2  # the first run's file stays


def test_a_run_from_step_0_in_a_used_model_dir_replaces_the_earlier_records(
    six_steps: Path, tmp_path: Path
) -> None:
    """``autoload_last_checkpoint: false`` starts from step 0 beside the earlier run's checkpoints: its steps
    replace that run's records in metrics.jsonl (each step once, the new values) and in TensorBoard."""
    model_dir = tmp_path / "m"
    shutil.copytree(six_steps, model_dir)
    params = json.loads(json.dumps(TINY))
    seed = params["runconfig"]["seed"] + 1  # another initialisation: other losses from step 1 on
    params["runconfig"].update(max_steps=4, eval_frequency=2, autoload_last_checkpoint=False, seed=seed)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = run(tmp_path / "params.yaml", model_dir)
    assert r.returncode == 0, r.stderr
    assert "resuming from" not in (model_dir / "run.log").read_text()
    _assert_events_match_metrics(model_dir)
    before, _ = _rows(six_steps)
    after, evals_after = _rows(model_dir)  # a step twice fails here
    assert sorted(after) == [1, 2, 3, 4] and sorted(evals_after) == [2, 4]
    assert all(after[s]["loss"] != before[s]["loss"] for s in after)  # this run's records, not the earlier's


def _start(params: Path, model_dir: Path) -> subprocess.Popen[str]:
    cmd = [*weightstream_cmd(), "run", str(params), "--model_dir", str(model_dir)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_that_replays_steps_after_losing_a_shard_logs_each_step_once(tmp_path: Path) -> None:
    """MemoryX-0 is killed after step 11 (and before the snapshot of 15): every shard rolls back to the
    snapshot of step 10 and steps 11 on are replayed. The replays are checked, not logged: each step is
    in the files once."""
    steps, strike = 24, 11
    params = write_params(tmp_path, max_steps=steps, eval_frequency=8, recovery_snapshot_steps=5)
    model_dir = tmp_path / "m"
    proc = _start(params, model_dir)
    try:

        def logged() -> int:  # read live, while it runs
            assert proc.poll() is None, proc.communicate()
            return len(_scalars(model_dir / "train").get("loss", []))

        wait_until(lambda: logged() >= strike, f"step {strike} in the event files", 120, poll_s=0.02)
        ready = json.loads((model_dir / "logs" / "memoryx-0.ready.json").read_text())
        os.kill(int(ready["pid"]), signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    replayed = re.search(r"replaying (\d+) steps from step (\d+)", (model_dir / "run.log").read_text())
    assert replayed and int(replayed[1]) >= 1 and replayed[2] == "10", "rolled back to the snapshot of 10"
    _assert_events_match_metrics(model_dir)
    written = _records(model_dir / "train")
    assert len(written) == len(set(written)) == steps * (len(TRAIN_SCALARS) + 1)
    assert sorted(s for t, s in _records(model_dir / "eval")) == [8, 16, 24]


# -- RunEvents without processes ---------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rates_are_modelzoos_samples_per_second_of_the_window_and_of_the_run(tmp_path: Path) -> None:
    clock = _Clock()
    with RunEvents(tmp_path, start_step=10, batch_size=8, with_eval=False, clock=clock) as events:
        clock.t += 2.0  # steps 11, 12 in 2 s
        assert events.rates(12) == SampleRates(local_samples_per_sec=8.0, avg_samples_per_sec=8.0)
        clock.t += 1.0  # steps 13 to 16 in 1 s
        assert events.rates(16) == SampleRates(local_samples_per_sec=32.0, avg_samples_per_sec=16.0)


def test_each_step_is_on_disk_at_once_and_the_files_close_on_an_error(tmp_path: Path) -> None:
    """tensorboardX's own thread flushes the first events and then every 120 s only: each logged step and
    evaluation is flushed, so TensorBoard shows them while the run goes on."""
    failed = False
    try:
        with RunEvents(tmp_path, 0, 8, with_eval=True) as events:
            for step in (1, 2, 3):
                events.log_step(_line(step, 2.5 - step, events.rates(step)))
                events.log_eval(step, 2.25 - step)
                assert _scalars(tmp_path / "train").get("loss", [])[-1:] == [(step, 2.5 - step)]
                assert _scalars(tmp_path / "eval").get("loss", [])[-1:] == [(step, 2.25 - step)]
            events.log_step(None)  # type: ignore[arg-type]  # not a line: AttributeError out of the block
    except AttributeError:
        failed = True
    assert failed
    assert events.train.closed and events.eval is not None and events.eval.closed


def test_a_restart_within_the_same_second_keeps_the_earlier_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorboardX names files by the second and opens them with "wb": a restart in the same second must
    not overwrite the earlier attempt's file, and must come after it in TensorBoard's reading order."""
    # time.time names the file (tensorboardX's EventsWriter): both writers start in the same second
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.5)
    for start, loss in ((0, 1.0), (2, 5.0)):
        with RunEvents(tmp_path, start, 8, with_eval=False) as events:
            for step in range(start + 1, 4):
                events.log_step(_line(step, loss + step, events.rates(step)))
    assert _scalars(tmp_path / "train")["loss"] == [(1, 2.0), (2, 3.0), (3, 8.0)]


def test_a_run_without_eval_input_writes_no_eval_directory(tmp_path: Path) -> None:
    events = RunEvents(tmp_path, 0, 8, with_eval=False)
    with events, pytest.raises(RuntimeError, match="made with_eval=False, yet an evaluation was logged"):
        events.log_eval(1, 1.0)
    assert not (tmp_path / "eval").exists() and (tmp_path / "train").is_dir()


def test_a_resumed_run_without_evaluation_still_hides_the_earlier_attempts_later_evaluations(
    tmp_path: Path,
) -> None:
    rates = SampleRates(local_samples_per_sec=1.0, avg_samples_per_sec=1.0)
    with RunEvents(tmp_path, 0, 8, with_eval=True) as events:
        for step in (2, 6):
            events.log_step(_line(step, 3.0, rates))
            events.log_eval(step, 3.5)
    with RunEvents(tmp_path, 4, 8, with_eval=False):
        pass  # resumed from step 4, with no eval_input now: nothing past step 4 is shown
    assert _scalars(tmp_path / "eval")["loss"] == [(2, 3.5)]
    assert _scalars(tmp_path / "train")["loss"] == [(2, 3.0)]

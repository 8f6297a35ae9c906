"""Admission as one pipeline: each check of a context runs once per admission, in the order of ``CHECKS``;
the service stops at the first check that finds a problem; and ``weightstream validate``, ``weightstream
run`` and ``JobService.submit`` all admit through that one list of checks."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.params_files import TINY
from weightstream.jobs import admission
from weightstream.jobs.admission import CHECKS, Admission, Submission, admit
from weightstream.jobs.config import ServiceConfig
from weightstream.jobs.limits import ServiceLimits
from weightstream.jobs.service import JobService, QueueFull
from weightstream.params import ParamsError

LOCAL = ["params", "sequence_lengths", "data", "memory", "start_checkpoint"]
# the service with a num_csx in the request (held to the slots before the params are read)
SERVICE = ["request", "requested_slots", "params", "service_limits", "data_roots", "sequence_lengths", "data"]


def _config(tmp_path: Path, **limits: Any) -> ServiceConfig:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return ServiceConfig(tmp_path / "data", 2, data_roots=(root,), limits=ServiceLimits(**limits))


def _submitted(config: ServiceConfig, params: dict[str, Any], num_csx: int | None = 1) -> Admission:
    model_dir = str(config.data_dir / "jobs" / "j")
    return Admission.submitted(Submission(copy.deepcopy(params), num_csx), config, {"model_dir": model_dir})


def _hdf5(tmp_path: Path, length: int = 12) -> dict[str, Any]:
    """TINY reading an HDF5 dataset under the root whose sequence length (``length``) the params leave
    out."""
    import h5py
    import numpy as np

    (tmp_path / "root" / "h5").mkdir(parents=True)
    with h5py.File(tmp_path / "root" / "h5" / "part.h5", "w") as f:
        f.create_dataset("data", data=np.ones((16, 3, length), np.int32))
    raw = copy.deepcopy(TINY)
    del raw["eval_input"]
    raw["train_input"] = {"data_processor": "GptHDF5MapDataProcessor", "data_dir": "h5", "batch_size": 8}
    return raw


def test_the_pipeline_names_each_check_once() -> None:
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names)), names
    assert [n for n in names if n in LOCAL] == LOCAL  # the command line's, in this order
    assert [n for n in names if n in SERVICE] == SERVICE


def test_a_run_here_asks_each_of_its_checks_once_in_order(small: dict[str, Any], tmp_path: Path) -> None:
    small["runconfig"]["model_dir"] = str(tmp_path / "model_dir")
    a = admit(Admission.local(small))
    assert a.ran == LOCAL and a.found == {}


def test_a_submission_asks_each_of_the_services_checks_once_in_order(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert admit(_submitted(config, TINY)).ran == SERVICE
    # without num_csx the params say how many: they are held to the slots once read, at the end
    without = admit(_submitted(config, TINY, num_csx=None)).ran
    assert without == [n for n in SERVICE if n != "requested_slots"] + ["params_slots"]
    # a sequence length read from the files: the tokens it gives are checked right after
    read = admit(_submitted(config, _hdf5(tmp_path)))
    assert read.ran == [*SERVICE[:6], "read_lengths_limits", "data"]
    assert read.lengths_read == ("train_input",) and read.params.train_input is not None
    assert read.params.train_input.max_sequence_length == 12


def test_a_length_read_from_the_files_is_held_to_the_token_limit(tmp_path: Path) -> None:
    """8 samples pass a limit of 64 tokens while the length is unknown (1 a sample); 8 x 12 do not."""
    a = _submitted(_config(tmp_path, max_tokens_per_step=64), _hdf5(tmp_path))
    with pytest.raises(ParamsError) as e:
        admit(a)
    (problem,) = e.value.problems
    assert problem.path == "train_input.batch_size" and problem.value == 8
    assert problem.message.startswith("a step has 96 tokens (batch_size x max_sequence_length)")
    assert "(serve --max-tokens-per-step)" in problem.message
    assert a.ran == [*SERVICE[:6], "read_lengths_limits"]  # the data is not opened


def test_the_service_stops_at_the_first_check_that_finds_a_problem(tmp_path: Path) -> None:
    """Too large and reading outside the roots: refused for its size alone, before any path is looked
    at; the refusal names what the user wrote (trainer: layout)."""
    from weightstream.params.convert import to_trainer

    raw = copy.deepcopy(TINY)
    raw["model"] |= {"num_hidden_layers": 2000, "vocab_size": 256}  # byte-level text
    raw["train_input"] |= {"data_processor": "TextFileDataProcessor", "data_dir": str(tmp_path)}
    trainer, _ = to_trainer(raw)
    a = _submitted(_config(tmp_path), trainer)
    with pytest.raises(ParamsError) as e:
        admit(a)
    assert [q.path for q in e.value.problems] == ["trainer.init.model.num_hidden_layers"]
    assert a.ran == SERVICE[:4] and list(a.found) == ["service_limits"]


def test_the_request_is_refused_before_its_params_are_read(tmp_path: Path) -> None:
    a = Admission.submitted(Submission({"not": "params"}, 1, priority=7), _config(tmp_path), {})
    with pytest.raises(ParamsError, match="invalid request") as e:
        admit(a)
    assert [q.path for q in e.value.problems] == ["priority"] and a.ran == ["request"]


def test_a_run_here_hears_every_problem_at_once(small: dict[str, Any], tmp_path: Path) -> None:
    small["runconfig"]["model_dir"] = str(tmp_path / "model_dir")
    small["runconfig"]["max_steps"] = -1
    small["train_input"] |= {"data_processor": "TextFileDataProcessor", "data_dir": str(tmp_path / "nope")}
    small["model"] |= {"num_hidden_layers": 10**9}
    a = Admission.local(small)
    with pytest.raises(ParamsError) as e:
        admit(a)
    paths = [q.path for q in e.value.problems]
    assert paths == ["runconfig.max_steps", "train_input.data_dir", "model.num_hidden_layers"]
    assert a.ran == LOCAL  # each asked once; the checkpoint check leaves a model too large alone


def _params_file(tmp_path: Path, small: dict[str, Any]) -> Path:
    """The small params, with a model_dir whose newest checkpoint is its last step: `run` has nothing
    to do, says so and starts no role."""
    small["runconfig"]["model_dir"] = str(tmp_path / "model_dir")
    last = tmp_path / "model_dir" / "checkpoint_4"
    last.mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 4}), encoding="utf-8")
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(small), encoding="utf-8")
    return f


def test_validate_run_and_the_service_admit_through_the_one_pipeline(
    tmp_path: Path, small: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry point runs each check of its context exactly once, and only through ``CHECKS``: with
    every check counted there, an entry point that checked on its own path, or twice, would show."""
    from weightstream.cli import app

    calls: Counter[str] = Counter()

    def counted(check: admission.Check) -> admission.Check:
        def run(a: Admission) -> list[Any]:
            calls[check.name] += 1
            return check.run(a)

        return dataclasses.replace(check, run=run)

    monkeypatch.setattr(admission, "CHECKS", tuple(counted(c) for c in CHECKS))
    f = _params_file(tmp_path, small)
    for verb in ("validate", "run"):
        calls.clear()
        r = CliRunner().invoke(app, [verb, str(f)], env={"COLUMNS": "200", "TERM": "dumb"})
        assert r.exit_code == 0 and "nothing to do" in r.output, (verb, r.output)
        assert calls == Counter(LOCAL), verb

    calls.clear()
    # a queue that takes no job: the submission is admitted in full, then refused, and nothing starts
    service = JobService(_config(tmp_path, max_queued_jobs=0), runner_factory=lambda *a: None)  # type: ignore[arg-type]  # no runner: no job starts
    try:
        with pytest.raises(QueueFull):
            service.submit(copy.deepcopy(TINY), num_csx=1)
    finally:
        service.shutdown(grace_s=5)
    assert calls == Counter(SERVICE)

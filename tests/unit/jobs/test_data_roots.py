"""Jobs submitted to the service read data only under its data roots: real files, real links, a real
JobService (its jobs never start here: the runner factory is a fake that blocks)."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import Fleet
from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.jobs.service import JobService, ServiceConfig
from weightstream.params import ParamsError, load_params

TEXT = "the quick brown fox jumps over the lazy dog. " * 20  # 900 bytes: plenty of 17-token samples


def _text_params(data_dir: str | list[str], eval_dir: str | list[str] | None = None) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    raw["model"]["vocab_size"] = 256  # byte-level tokens
    raw["train_input"].update(data_processor="TextFileDataProcessor", data_dir=data_dir)
    if eval_dir is None:
        del raw["eval_input"]
    else:
        raw["eval_input"].update(data_processor="TextFileDataProcessor", data_dir=eval_dir)
    return raw


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """Two data roots with a dataset each, and secrets beside them (outside every root)."""
    a, b = tmp_path / "root-a", tmp_path / "root-b"
    for root in (a, b):
        (root / "corpus").mkdir(parents=True)
        (root / "corpus" / "part.txt").write_text(TEXT)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key.txt").write_text(TEXT)  # readable by the service, and would train fine
    return a, b


@pytest.fixture
def service(tmp_path: Path, roots: tuple[Path, Path]) -> Iterator[JobService]:
    s = JobService(ServiceConfig(tmp_path / "data", 2, data_roots=roots), runner_factory=Fleet())
    yield s
    s.shutdown(grace_s=5)


def _refusal(service: JobService, raw: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ParamsError) as e:
        service.submit(raw, num_csx=1)
    assert service.store.list() == [], "a refused job must not be stored"
    return {p.path: p for p in e.value.problems}


def test_a_path_outside_the_roots_gets_one_answer_whether_or_not_it_exists(
    service: JobService, tmp_path: Path
) -> None:
    """No existence, no size: the message for a real file's directory and for nothing at all is one."""
    seen = []
    for path in (tmp_path / "secrets", tmp_path / "no-such-dir", Path("/etc"), Path("/proc/self")):
        problem = _refusal(service, _text_params(str(path)))["train_input.data_dir"]
        assert "outside the service's data roots" in problem.message and problem.value == str(path)
        seen.append(problem.message)
    assert len(set(seen)) == 1, seen
    assert str(service.config.data_roots[0]) in seen[0]  # it says where data may be


def test_dot_dot_and_links_that_leave_a_root_are_refused(
    service: JobService, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = roots
    (a / "escape").symlink_to(tmp_path / "secrets")  # a directory link out of the root
    (a / "leaky").mkdir()
    (a / "leaky" / "ok.txt").write_text(TEXT)
    (a / "leaky" / "key.txt").symlink_to(tmp_path / "secrets" / "key.txt")  # a file link out of it
    for data_dir in (str(a / ".." / "secrets"), str(a / "escape"), "../secrets", "escape"):
        problem = _refusal(service, _text_params(data_dir))["train_input.data_dir"]
        assert problem.message.startswith("is outside the service's data roots"), (data_dir, problem)
    problem = _refusal(service, _text_params(str(a / "leaky")))["train_input.data_dir"]
    assert "'key.txt', a link leading outside" in problem.message
    assert str(tmp_path / "secrets") not in problem.message  # where it leads is not told


def test_paths_inside_the_roots_are_accepted_and_the_job_reads_their_real_path(
    service: JobService, roots: tuple[Path, Path]
) -> None:
    a, b = roots
    (b / "alias").symlink_to(a / "corpus")  # a link between roots stays inside them
    job = service.submit(_text_params("corpus", eval_dir=[str(b / "alias"), str(b / "corpus")]), num_csx=1)
    assert job.params["train_input"]["data_dir"] == str(a / "corpus")  # relative: from the first root
    assert job.params["eval_input"]["data_dir"] == [str(a / "corpus"), str(b / "corpus")]


def test_each_path_of_a_list_is_named(service: JobService, roots: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = roots
    problems = _refusal(service, _text_params([str(a / "corpus"), str(tmp_path / "secrets")]))
    assert list(problems) == ["train_input.data_dir[1]"]


def test_unreadable_data_inside_a_root_is_named_by_its_section(
    service: JobService, roots: tuple[Path, Path]
) -> None:
    a, _ = roots
    (a / "empty").mkdir()
    problems = _refusal(service, _text_params("corpus", eval_dir="empty"))
    assert (
        list(problems) == ["eval_input.data_dir"]
        and "no *.txt files" in problems["eval_input.data_dir"].message
    )


def test_the_default_root_is_created_under_the_data_dir(tmp_path: Path) -> None:
    service = JobService(ServiceConfig(tmp_path / "data", 1), runner_factory=Fleet())
    try:
        assert service.config.data_roots == (tmp_path / "data" / "datasets",)
        assert (tmp_path / "data" / "datasets").is_dir()
    finally:
        service.shutdown(grace_s=5)


@pytest.mark.parametrize("root", ["data", "data/jobs", "data/jobs/x", "."])
def test_a_root_overlapping_the_job_directory_is_refused(tmp_path: Path, root: str) -> None:
    """Other jobs' checkpoints and logs must never be a data root's content."""
    with pytest.raises(ValueError, match="overlaps the service's job directory"):
        ServiceConfig(tmp_path / "data", 1, data_roots=(tmp_path / root,))


def test_a_missing_root_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        JobService(
            ServiceConfig(tmp_path / "data", 1, data_roots=(tmp_path / "nope",)), runner_factory=Fleet()
        )


def test_weightstream_run_reads_any_path(tmp_path: Path, roots: tuple[Path, Path]) -> None:
    """The roots are the service's: params loaded for `weightstream run` keep any data_dir as given."""
    from weightstream.data import make_data_processor

    p = load_params(_text_params(str(tmp_path / "secrets")))
    assert p.train_input.data_dir == str(tmp_path / "secrets")
    num_samples = make_data_processor(p.train_input, p.model, "train").num_samples
    assert num_samples is not None and num_samples > 0


def test_a_nul_byte_is_outside_too(service: JobService) -> None:
    problem = _refusal(service, _text_params("corpus\0/x"))["train_input.data_dir"]
    assert "outside the service's data roots" in problem.message


def test_the_service_creates_nothing_world_readable(tmp_path: Path) -> None:
    """Under a permissive umask, the data dir, job dir, job store and a started job's directory are
    closed to other users (the files a job writes follow `serve`'s umask and storage_io's mode)."""
    old = os.umask(0)
    fleet = Fleet()
    try:
        service = JobService(ServiceConfig(tmp_path / "data", 1), runner_factory=fleet)
        job = service.submit(copy.deepcopy(TINY), 1, {"name": "j"})
        wait_until(lambda: fleet.started == ["j"], lambda: f"started {fleet.started}")
        fleet.runners["j"].finish()
        service.shutdown(grace_s=5)
    finally:
        os.umask(old)
    data = tmp_path / "data"
    for path in (data, data / "jobs", data / "datasets", Path(job.model_dir)):
        assert path.stat().st_mode & 0o007 == 0, f"{path} is open to other users: {oct(path.stat().st_mode)}"
    for path in data.glob("jobs.sqlite*"):
        assert path.stat().st_mode & 0o077 == 0, f"{path}: {oct(path.stat().st_mode)}"


def _hdf5_params(**train_input: Any) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    del raw["eval_input"]
    raw["train_input"] = {
        "data_processor": "GptHDF5MapDataProcessor",
        "batch_size": 8,
        "max_sequence_length": 16,
        **train_input,
    }
    return raw


def test_mixture_dirs_and_hdf5_links_are_confined_too(
    service: JobService, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """A mixture names a data_dir per dataset: each is confined like data_dir, and an .h5 file inside a
    root that links out is refused (GptHDF5MapDataProcessor reads *.h5)."""
    a, _ = roots
    mixture = [{"data_dir": "corpus", "weight": 1}, {"data_dir": str(tmp_path / "secrets"), "weight": 2}]
    problems = _refusal(service, _hdf5_params(mixture=mixture))
    assert set(problems) == {"train_input.mixture[1].data_dir"}
    assert "outside the service's data roots" in problems["train_input.mixture[1].data_dir"].message
    (tmp_path / "secrets" / "key.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    (a / "h5").mkdir()
    (a / "h5" / "part.h5").symlink_to(tmp_path / "secrets" / "key.h5")
    problems = _refusal(service, _hdf5_params(data_dir="h5"))
    assert "link leading outside" in problems["train_input.data_dir"].message
    problems = _refusal(service, _hdf5_params(mixture=[{"data_dir": "h5"}]))
    assert "link leading outside" in problems["train_input.mixture[0].data_dir"].message


def test_a_starting_checkpoint_is_confined_to_the_roots_like_data(
    service: JobService, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """runconfig.checkpoint_path: read with the service's rights like data, so under the roots only (a
    weights file in it that links out is refused too), and the job gets the real path."""
    a, _ = roots
    raw = _text_params("corpus")
    problem = _refusal(
        service, {**raw, "runconfig": {**raw["runconfig"], "checkpoint_path": str(tmp_path / "secrets")}}
    )
    assert "outside the service's data roots" in problem["runconfig.checkpoint_path"].message
    (a / "models" / "leaky").mkdir(parents=True)
    (a / "models" / "leaky" / "model.safetensors").symlink_to(tmp_path / "secrets" / "key.txt")
    leaky = {**raw, "runconfig": {**raw["runconfig"], "checkpoint_path": str(a / "models" / "leaky")}}
    assert "a link leading outside" in _refusal(service, leaky)["runconfig.checkpoint_path"].message
    (a / "models" / "gpt2").mkdir()
    job = service.submit(
        {**raw, "runconfig": {**raw["runconfig"], "checkpoint_path": "models/gpt2"}}, num_csx=1
    )
    assert job.params["runconfig"]["checkpoint_path"] == str(a / "models" / "gpt2")


def test_a_trainer_layout_job_is_confined_named_as_written_and_reads_its_length_inside(
    service: JobService, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """A trainer: file is submitted as it is: its paths are confined like the legacy ones and named as the
    user wrote them; an HDF5 input's left-out sequence length is read from the files only once they are
    known to be inside the roots."""
    import h5py
    import numpy as np

    from weightstream.params.convert import to_trainer

    a, _ = roots
    (a / "h5").mkdir()
    with h5py.File(a / "h5" / "part.h5", "w") as f:
        f.create_dataset("data", data=np.ones((16, 3, 12), np.int32))
    raw = _hdf5_params(data_dir="h5")
    del raw["train_input"]["max_sequence_length"]
    trainer, _ = to_trainer(raw)
    trainer["trainer"]["fit"]["train_dataloader"]["data_dir"] = str(tmp_path / "secrets")
    problems = _refusal(service, trainer)
    assert "outside the service's data roots" in problems["trainer.fit.train_dataloader.data_dir"].message
    trainer["trainer"]["fit"]["train_dataloader"]["data_dir"] = "h5"
    job = service.submit(trainer, num_csx=1)
    assert job.params["train_input"]["data_dir"] == str(a / "h5")  # stored resolved, in the legacy layout
    assert job.params["train_input"]["max_sequence_length"] == 12  # from the files, inside the root

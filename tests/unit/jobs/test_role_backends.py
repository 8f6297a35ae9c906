"""Which backend the service gives a job: on Slurm, one named after the job, its priority as Slurm's nice,
never inside the allocation the service itself may run in."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.backends.local import LocalProcessBackend
from weightstream.backends.slurm.backend import SlurmBackend
from weightstream.backends.slurm.placement import NodeRule, PlacementRules
from weightstream.jobs.config import ServiceConfig
from weightstream.jobs.role_backends import end_leftovers, make_backend
from weightstream.params import Params

NO_PARAMS = Params.model_construct()  # type: ignore[call-arg]  # empty: only the Kubernetes backend reads them


def slurm_backend(tmp_path: Path, priority: int, environ: dict[str, str]) -> SlurmBackend:
    rules = PlacementRules(workers=NodeRule("batch", ("wafer",)))
    config = ServiceConfig(tmp_path, 4, backend="slurm", slurm=rules)
    made = make_backend(config, "0123abcd4567", NO_PARAMS, tmp_path / "logs", priority,
                        lambda _: None, environ)  # fmt: skip
    assert isinstance(made, SlurmBackend)
    assert made.rules == rules and made.run_dir == tmp_path / "logs"
    return made


@pytest.mark.parametrize(("priority", "nice"), [(1, 0), (2, 100), (3, 200)])
def test_a_job_on_slurm_is_named_after_it_with_its_priority_as_nice(
    tmp_path: Path, priority: int, nice: int
) -> None:
    made = slurm_backend(tmp_path, priority, {"SLURM_CONF": "/etc/slurm.conf"})
    assert made.job_name == "weightstream-0123abcd4567"
    assert made.nice == nice


def test_a_service_inside_an_allocation_still_gives_each_job_its_own(tmp_path: Path) -> None:
    made = slurm_backend(tmp_path, 2, {"SLURM_JOB_ID": "7", "SLURM_JOBID": "7", "SLURM_CONF": "/c"})
    assert made.given_job is None
    assert made.environ == {"SLURM_CONF": "/c"}


def test_other_backends_leave_nothing_to_end_and_run_locally(tmp_path: Path) -> None:
    config = ServiceConfig(tmp_path, 4)
    assert end_leftovers(config, "0123abcd4567") == []
    made = make_backend(config, "j", NO_PARAMS, tmp_path / "logs", 2, lambda _: None)
    assert isinstance(made, LocalProcessBackend)

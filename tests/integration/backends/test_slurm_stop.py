"""The Slurm backend's stop, twice: a service's cancel stops a job's roles on one thread while its run,
winding down, stops them again on another; the allocation is given back once, and neither call fails.
Slurm's commands are replaced by a recording fake; the salloc holding the allocation is a real process
that waits, as salloc's command does, for its standard input to close."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from weightstream.backends.slurm import backend as slurm_backend
from weightstream.backends.slurm.backend import SlurmBackend


class FakeSlurm:
    """What the backend asks of Slurm while it stops: no steps left, every job gone at once."""

    def __init__(self) -> None:
        self.cancelled: list[list[str]] = []
        self.released: list[subprocess.Popen[str]] = []
        self._release = slurm_backend.slurm.release

    def job_steps(self, job: str, env: object = None) -> dict[str, str]:
        return {}

    def cancel(self, ids: list[str], signal: str | None = None, env: object = None) -> None:
        self.cancelled.append(list(ids))

    def live_job(self, job: str, env: object = None) -> None:
        return None

    def release(self, holder: subprocess.Popen[str]) -> None:
        self.released.append(holder)
        self._release(holder)


def test_stopping_twice_gives_the_allocation_back_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm()
    for name in ("job_steps", "cancel", "live_job", "release"):
        monkeypatch.setattr(slurm_backend.slurm, name, getattr(fake, name))
    backend = SlurmBackend(tmp_path, "weightstream-job", environ={})
    holder = subprocess.Popen(["sh", "-c", "read _"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    backend._holder, backend.job_id = holder, "12"
    backend.stop()
    backend.stop()  # the run's own stop, after the cancel's
    assert fake.released == [holder] and holder.returncode is not None
    assert fake.cancelled.count(["12"]) == 2  # each stop makes sure the job is gone

"""Where the service runs a job's roles: the backend ``serve --backend`` names, made for one job.

- ``local``: processes on the service's machine.
- ``kubernetes``: pods in the configured namespace (the client is an optional extra, imported here only).
- ``slurm``: one Slurm job per service job, named ``weightstream-<job id>`` so that ``squeue`` shows which
  is which and a restarted service finds what its predecessor left (``end_leftovers``). The service's
  priorities map onto ``salloc --nice`` (``SLURM_NICE``): a user who is not a Slurm operator may only
  lower a job's priority, so the most urgent level is Slurm's default and the others step behind it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from weightstream.backends.base import Backend
from weightstream.backends.kubernetes import INSTALL_HINT, client_available
from weightstream.backends.kubernetes.manifests import ClusterConfig
from weightstream.backends.local import LocalProcessBackend
from weightstream.backends.slurm.placement import PlacementRules
from weightstream.jobs.config import ServiceConfig
from weightstream.params import Params

__all__ = ["SLURM_NICE", "end_leftovers", "make_backend", "slurm_job_name"]

# the service's priority (1 runs first) -> the nice of its Slurm job
SLURM_NICE = {1: 0, 2: 100, 3: 200}
# names the allocation of the service's own environment (it may run inside one): each job must get its own
_ALLOCATION_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")


def slurm_job_name(job_id: str) -> str:
    """The name of the Slurm job that runs service job ``job_id``."""
    return f"weightstream-{job_id}"


def _slurm_environ(environ: Mapping[str, str] | None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k not in _ALLOCATION_VARIABLES}


def make_backend(
    config: ServiceConfig,
    job_id: str,
    params: Params,
    run_dir: Path,
    priority: int,
    on_progress: Callable[[str], None],
    environ: Mapping[str, str] | None = None,
) -> Backend:
    """The backend of job ``job_id`` (its roles' logs go to ``run_dir``: ``model_dir/logs``)."""
    if config.backend == "kubernetes":
        if not client_available():
            raise RuntimeError(f"the Kubernetes backend needs the Kubernetes client: {INSTALL_HINT}")
        from weightstream.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(job_id, params, config.cluster or ClusterConfig(), on_progress=on_progress)
    if config.backend == "slurm":
        from weightstream.backends.slurm.backend import SlurmBackend

        return SlurmBackend(
            run_dir,
            slurm_job_name(job_id),
            config.slurm or PlacementRules(),
            environ=_slurm_environ(environ),
            nice=SLURM_NICE.get(priority, 0),
        )
    return LocalProcessBackend(run_dir)


def end_leftovers(config: ServiceConfig, job_id: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Before a job that was running when the service died runs again: end whatever of it the backend may
    still hold (the Slurm job of a service killed outright lives until Slurm has ended it, and holds the
    nodes the job needs). What was ended, in words ("Slurm job 12"); nothing for the other backends,
    whose roles end with the service (local) or are replaced by name (Kubernetes)."""
    if config.backend != "slurm":
        return []
    from weightstream.backends.slurm.backend import SlurmBackend

    backend = SlurmBackend(config.data_dir, slurm_job_name(job_id), environ=_slurm_environ(environ))
    return [f"Slurm job {job}" for job in backend.end_leftovers()]

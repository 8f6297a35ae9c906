"""The options of `weightstream serve` that bound what the service accepts (its data roots and limits), the
user name it records on each job, and the Kubernetes data volume (which `plan` takes too).

Kept apart from ``cli.py`` so that the command's signature stays one line per option; the defaults and
their meaning live in ``jobs.limits.ServiceLimits`` and ``jobs.config.ServiceConfig``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weightstream.jobs.limits import ServiceLimits

__all__ = [
    "DEFAULTS",
    "DataClaim",
    "DataRoots",
    "KeepCheckpointMax",
    "MaxJobSeconds",
    "MaxLayers",
    "MaxParams",
    "MaxQueuedJobs",
    "MaxStepsLimit",
    "MaxTokensPerStep",
    "MaxWorkers",
    "UserName",
    "service_limits",
]

DEFAULTS = ServiceLimits()
_PANEL = "Data roots and limits of submitted jobs (`weightstream run` has neither)"

DataClaim = Annotated[
    str | None,
    typer.Option(
        "--data-claim",
        help="kubernetes (required there): the PersistentVolumeClaim holding the service's --data-dir, "
        "mounted at /data in job pods (use --data-dir /data)",
        show_default=False,
    ),
]
DataRoots = Annotated[
    list[Path] | None,
    typer.Option(
        "--data-root",
        envvar="WEIGHTSTREAM_DATA_ROOTS",  # colon-separated, as click splits a path list
        help="a directory submitted jobs may read data under (repeat for several; the variable is "
        "colon-separated); default: <data-dir>/datasets",
        show_default=False,
        rich_help_panel=_PANEL,
    ),
]
MaxParams = Annotated[
    int, typer.Option("--max-params", min=1, help="parameters per model", rich_help_panel=_PANEL)
]
MaxLayers = Annotated[
    int, typer.Option("--max-layers", min=1, help="hidden layers per model", rich_help_panel=_PANEL)
]
MaxTokensPerStep = Annotated[
    int,
    typer.Option(
        "--max-tokens-per-step",
        min=1,
        help="batch_size x max_sequence_length of a step (batch_size for fc_mlp)",
        rich_help_panel=_PANEL,
    ),
]
MaxStepsLimit = Annotated[
    int, typer.Option("--max-steps", min=1, help="runconfig.max_steps", rich_help_panel=_PANEL)
]
MaxWorkers = Annotated[
    int,
    typer.Option(
        "--max-workers",
        min=1,
        help="num_csx, and weight or activation servers, per job",
        rich_help_panel=_PANEL,
    ),
]
MaxQueuedJobs = Annotated[
    int,
    typer.Option(
        "--max-queued-jobs", min=0, help="queued jobs; a submission beyond gets 429", rich_help_panel=_PANEL
    ),
]
MaxJobSeconds = Annotated[
    float,
    typer.Option(
        "--max-job-seconds",
        min=0,
        help="a job's wall-clock limit, over its runs; 0: none",
        rich_help_panel=_PANEL,
    ),
]
KeepCheckpointMax = Annotated[
    int,
    typer.Option(
        "--keep-checkpoint-max",
        min=0,
        help="checkpoints a job keeps when its params set no runconfig.keep_checkpoint_max; 0: all",
        rich_help_panel=_PANEL,
    ),
]


UserName = Annotated[
    str,
    typer.Option(
        "--user-name",
        envvar="WEIGHTSTREAM_USER_NAME",  # the Helm chart's userName, through the ConfigMap
        help="the USER recorded on each submitted job: the service has one token, hence one user; "
        "default: the OS user running the service",
        show_default=False,
    ),
]


def service_limits(
    max_params: int,
    max_layers: int,
    max_tokens_per_step: int,
    max_steps: int,
    max_workers: int,
    max_queued_jobs: int,
    max_job_seconds: float,
    keep_checkpoint_max: int,
) -> ServiceLimits:
    """The options' values as ServiceLimits (0 means none for the time limit and the retention)."""
    return ServiceLimits(
        max_params=max_params,
        max_layers=max_layers,
        max_tokens_per_step=max_tokens_per_step,
        max_steps=max_steps,
        max_workers=max_workers,
        max_queued_jobs=max_queued_jobs,
        max_job_seconds=max_job_seconds or None,
        keep_checkpoint_max=keep_checkpoint_max or None,
    )

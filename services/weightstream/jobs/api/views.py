"""The REST API's request and response bodies (pydantic): what crosses the edge, and nothing else."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from weightstream.jobs.limits import MAX_LABEL_LENGTH, MAX_LABELS
from weightstream.jobs.model_summary import model_summary
from weightstream.jobs.store import Job, JobStore

__all__ = [
    "Checkpoint",
    "CheckpointFile",
    "CheckpointList",
    "ErrorBody",
    "ErrorDetail",
    "HistoryEntry",
    "JobList",
    "JobView",
    "LabelsPatch",
    "Metrics",
    "PriorityRequest",
    "Status",
    "SubmitRequest",
]

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
LabelKey = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_LENGTH)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_LENGTH)]


class SubmitRequest(BaseModel):
    """The submission as OpenAPI documents it. These bounds are for the schema only: the service checks
    every one of them, and its configured limits, itself (``jobs.limits``), for gRPC as for REST."""

    model_config = ConfigDict(extra="forbid")
    params: dict[str, Any] = Field(description="the params file (ModelZoo layout) as a JSON object")
    num_csx: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="CS-2 workers; overrides runconfig.num_csx (the service may allow fewer). Left out "
        "or null: the params' runconfig.num_csx (1 if they do not say)",
    )
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    priority: int = Field(default=2, ge=1, le=3, description="1 runs before 2 before 3")


class LabelsPatch(BaseModel):
    """A change of a job's labels; the job keeps at most as many labels as a submission may have (the
    service checks the result: 422 beyond)."""

    model_config = ConfigDict(extra="forbid")
    set: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=MAX_LABELS, description="labels to add or overwrite"
    )
    remove: list[LabelKey] = Field(
        default_factory=list, max_length=MAX_LABELS, description="keys to remove; a missing key is no error"
    )


class PriorityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int = Field(ge=1, le=3, description="1 runs before 2 before 3")


EPOCH_S = "seconds since the Unix epoch (UTC); `wsctl get -o yaml|json` shows ISO 8601"


class HistoryEntry(BaseModel):
    status: Status
    at: float = Field(description=EPOCH_S)
    reason: str | None = None


class JobFaults(BaseModel):
    """What fault recovery has done in a job, from its stored events."""

    restarts: dict[str, int] = Field(description="roles replaced so far, by role kind")
    workers: int = Field(
        description="the CS-2 workers it trains with now: num_csx, or fewer while a lost worker found no "
        "capacity to start again (runconfig.min_num_csx)"
    )
    last_workers_change: str | None = Field(None, description="why the worker count last changed, if it did")
    last_straggler: str | None = Field(
        None,
        description="the newest straggler warning, if any: the worker that held the steps back, its host, "
        "how many times the other workers' median time, for how many steps, up to which step",
    )

    @staticmethod
    def of(job: Job, store: JobStore) -> JobFaults:
        change = store.last_event(job.id, "workers")
        data = change["data"] if change else {}
        slow = store.last_event(job.id, "straggler")
        return JobFaults(
            restarts=store.role_restarts(job.id),
            workers=int(data.get("to_workers", job.num_csx)),
            last_workers_change=data.get("reason"),
            last_straggler=_straggler_text(slow["data"]) if slow else None,
        )


def _straggler_text(e: dict[str, Any]) -> str:
    """A straggler event's data in words: ``step 30: worker-1 on h2, 4.3x the others for 3 steps``."""
    ratio = e.get("ratio")
    times = f"{ratio:.1f}x" if isinstance(ratio, int | float) else "?x"
    who = f"{e.get('worker')} on {e.get('host')}"
    return f"step {e.get('step')}: {who}, {times} the others for {e.get('steps')} steps"


class JobView(BaseModel):
    """A job as both APIs describe it (the gRPC API sends this object as JSON)."""

    id: str
    status: Status
    num_csx: int
    labels: dict[str, str]
    priority: int
    user: str = Field(description="who submitted it: the service's user name (serve --user-name)")
    created_at: float = Field(description=EPOCH_S)
    updated_at: float = Field(description=EPOCH_S)
    duration_s: float = Field(description="seconds spent running, over every run; a run under way counts")
    error: str | None
    history: list[HistoryEntry]
    params: dict[str, Any]
    num_parameters: int = Field(description="weights in the model (0 if its params no longer load)")
    density: float = Field(
        description="the share of weights that may be non-zero: 1.0 dense, 0.1 at 90% sparsity"
    )
    faults: JobFaults | None = Field(
        None, description="what fault recovery has done; given where one job is asked for, not in lists"
    )

    @staticmethod
    def of(job: Job, store: JobStore | None = None) -> JobView:
        """``store``: add ``faults`` from the job's events (two indexed queries)."""
        num_parameters, density = model_summary(job.params)
        return JobView(
            id=job.id,
            status=job.status,
            num_csx=job.num_csx,
            labels=job.labels,
            priority=job.priority,
            user=job.user,
            created_at=job.created_at,
            updated_at=job.updated_at,
            duration_s=job.running_seconds(now=time.time()),
            error=job.error,
            history=[HistoryEntry(**h) for h in job.history],
            params=job.params,
            num_parameters=num_parameters,
            density=density,
            faults=JobFaults.of(job, store) if store is not None else None,
        )


class JobList(BaseModel):
    jobs: list[JobView]


class Metrics(BaseModel):
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]


class CheckpointFile(BaseModel):
    name: str
    size: int


class Checkpoint(BaseModel):
    step: int
    files: list[CheckpointFile]


class CheckpointList(BaseModel):
    checkpoints: list[Checkpoint]


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail

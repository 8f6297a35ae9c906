"""/v1/jobs: submit, list, get and cancel jobs; change a job's labels and priority; a job's metrics,
coordinator log and every log as one archive."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse, StreamingResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS, ApiError, error_doc
from weightstream.jobs.api.views import (
    JobList,
    JobView,
    LabelsPatch,
    Metrics,
    PriorityRequest,
    Status,
    SubmitRequest,
)
from weightstream.jobs.service import CapacityError, QueueFull
from weightstream.jobs.store import IllegalTransition, Job, JobFinished
from weightstream.params import ParamsError

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)
JobDep = Annotated[Job, Depends(existing_job)]


@router.post(
    "",
    status_code=201,
    responses={
        422: error_doc("invalid params or over a service limit (every problem's key path in details)"),
        429: error_doc("the queue is full, or the service is stopping: submit again later"),
    },
)
def submit(req: SubmitRequest, service: ServiceDep) -> JobView:
    # every bound is checked by service.submit (gRPC's path too); SubmitRequest's only document them
    try:
        return JobView.of(service.submit(req.params, req.num_csx, req.labels, req.priority))
    except ParamsError as e:
        raise ApiError(422, "invalid_params", str(e), [p.as_dict() for p in e.problems]) from e
    except CapacityError as e:
        raise ApiError(422, "over_capacity", str(e)) from e
    except QueueFull as e:
        raise ApiError(429, "queue_full", str(e)) from e


@router.get("")
def list_jobs(
    service: ServiceDep,
    status: Status | None = None,
    label: Annotated[list[str] | None, Query(description="key=value; repeat to require several")] = None,
) -> JobList:
    wanted = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ApiError(422, "invalid_request", f"label filter {item!r} must be key=value")
        wanted[key] = value
    return JobList(jobs=[JobView.of(j) for j in service.store.list(status, wanted)])


@router.get("/{job_id}")
def get_job(job: JobDep, service: ServiceDep) -> JobView:
    return JobView.of(job, service.store)


@router.delete("/{job_id}", responses={409: error_doc("the job has already finished")})
def cancel(job: JobDep, service: ServiceDep) -> JobView:
    try:
        return JobView.of(service.cancel(job.id))
    except IllegalTransition as e:
        raise ApiError(409, "conflict", str(e)) from e


@router.get("/{job_id}/metrics")
def job_metrics(job: JobDep, service: ServiceDep) -> Metrics:
    return Metrics(**service.metrics(job.id))


@router.get("/{job_id}/logs", response_class=PlainTextResponse)
def logs(
    job: JobDep, service: ServiceDep, tail: Annotated[int | None, Query(ge=1, le=100_000)] = None
) -> PlainTextResponse:
    return PlainTextResponse(service.logs(job.id, tail))


@router.patch(
    "/{job_id}/labels",
    responses={422: error_doc("a label too long, too many labels, or a key both set and removed")},
)
def set_labels(job: JobDep, change: LabelsPatch, service: ServiceDep) -> JobView:
    """Set and remove labels of a job, whatever its status; answers the job as it is then."""
    try:
        return JobView.of(service.set_labels(job.id, change.set, change.remove))
    except ParamsError as e:
        raise ApiError(422, "invalid_request", str(e), [p.as_dict() for p in e.problems]) from e


@router.put("/{job_id}/priority", responses={409: error_doc("the job has finished")})
def set_priority(job: JobDep, change: PriorityRequest, service: ServiceDep) -> JobView:
    """Change the priority of a queued or running job: a queued one takes its new place in the queue."""
    try:
        return JobView.of(service.set_priority(job.id, change.priority))
    except JobFinished as e:
        raise ApiError(409, "conflict", str(e)) from e


_GZIP = {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}


@router.get(
    "/{job_id}/logs/export",
    response_class=StreamingResponse,
    responses={200: {"description": "a tar.gz of the job's logs", "content": _GZIP}},
)
def export_logs(job: JobDep, service: ServiceDep) -> StreamingResponse:
    """run.log, every role's logs/*.log, params.yaml and metrics.jsonl as one tar.gz (``<id>/...``),
    streamed; plain files of the job's own directory only, each at most 64 MiB (its end), 256 MiB in all
    (what was cut is listed in ``<id>/TRUNCATED.txt``)."""
    try:
        chunks = service.export_logs(job.id)
    except FileNotFoundError as e:  # it has not started: no directory, no logs
        raise ApiError(404, "not_found", str(e)) from e
    headers = {"Content-Disposition": f'attachment; filename="{job.id}-logs.tar.gz"'}
    return StreamingResponse(chunks, media_type="application/gzip", headers=headers)

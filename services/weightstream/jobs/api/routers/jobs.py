"""/v1/jobs: submit, list, get and cancel jobs; a job's metrics and coordinator log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS, ApiError, error_doc
from weightstream.jobs.api.views import JobList, JobView, Metrics, Status, SubmitRequest
from weightstream.jobs.service import CapacityError, QueueFull
from weightstream.jobs.store import IllegalTransition, Job
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
def get_job(job: JobDep) -> JobView:
    return JobView.of(job)


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

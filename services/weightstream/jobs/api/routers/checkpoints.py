"""/v1/jobs/{job_id}/checkpoints: a job's complete checkpoints, and each of their files to download."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS, ApiError
from weightstream.jobs.api.views import Checkpoint, CheckpointList
from weightstream.jobs.store import Job

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)
JobDep = Annotated[Job, Depends(existing_job)]


@router.get("/{job_id}/checkpoints")
def checkpoints(job: JobDep, service: ServiceDep) -> CheckpointList:
    return CheckpointList(checkpoints=[Checkpoint(**c) for c in service.checkpoints(job.id)])


@router.get("/{job_id}/checkpoints/{step}/files/{name}", response_class=FileResponse)
def checkpoint_file(job: JobDep, service: ServiceDep, step: int, name: str) -> FileResponse:
    try:
        path = service.checkpoint_file(job.id, step, name)
    except KeyError as e:
        raise ApiError(404, "not_found", e.args[0]) from e
    return FileResponse(path, filename=name, media_type="application/octet-stream")

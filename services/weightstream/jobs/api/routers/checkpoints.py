"""/v1/jobs/{job_id}/checkpoints: a job's complete checkpoints, and each of their files to download.

Only plain files that really lie in the checkpoint's own directory are listed or served (the rule is
``checkpoint_layout.servable_file``, applied by ``JobService``): any other file, a symlink planted there
included, is missing as far as the API is concerned: the same 404, the same message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, BinaryIO
from urllib.parse import quote

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, StreamingResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS, ApiError
from weightstream.jobs.api.views import Checkpoint, CheckpointFile, CheckpointList
from weightstream.jobs.store import Job

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)
JobDep = Annotated[Job, Depends(existing_job)]


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(1 << 20):
            yield chunk


@router.get("/{job_id}/checkpoints")
def checkpoints(job: JobDep, service: ServiceDep) -> CheckpointList:
    """Complete checkpoints, by step, with the files that may be downloaded."""
    listed = [
        Checkpoint(step=c["step"], files=[CheckpointFile(**f) for f in c["files"]])
        for c in service.checkpoints(job.id)
    ]
    return CheckpointList(checkpoints=listed)


_FILE = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.get(
    "/{job_id}/checkpoints/{step}/files/{name}",
    response_class=FileResponse,
    responses={200: {"description": "the file's bytes", "content": _FILE}},
)
def checkpoint_file(job: JobDep, service: ServiceDep, step: int, name: str) -> StreamingResponse:
    try:
        f = service.open_checkpoint_file(job.id, step, name)
    except KeyError as e:
        raise ApiError(404, "not_found", e.args[0]) from e
    headers = {
        "Content-Length": str(os.fstat(f.fileno()).st_size),
        "Content-Disposition": f"attachment; filename*=utf-8''{quote(name)}",
    }
    return StreamingResponse(_chunks(f), media_type="application/octet-stream", headers=headers)

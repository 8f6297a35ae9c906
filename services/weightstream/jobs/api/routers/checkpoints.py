"""/v1/jobs/{job_id}/checkpoints: a job's complete checkpoints, and each of their files to download.

Only plain files that really lie in the checkpoint's own directory are listed or served: a job directory
is written by training processes, and a symlink planted there (or a checkpoint directory that is itself a
link) must not turn the API into a reader of any file the service can read. Such a file is missing as far
as the API is concerned: the same 404, the same message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, BinaryIO
from urllib.parse import quote

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, StreamingResponse

from weightstream.checkpoint_layout import checkpoint_dir
from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS, ApiError
from weightstream.jobs.api.views import Checkpoint, CheckpointFile, CheckpointList
from weightstream.jobs.store import Job

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)
JobDep = Annotated[Job, Depends(existing_job)]


def confined_file(model_dir: Path, step: int, name: str) -> Path | None:
    """The real path of checkpoint file ``name`` at ``step``, or None unless it is a plain file (no
    symlink) directly inside the job's ``checkpoint_<step>`` directory, itself no link elsewhere."""
    path = checkpoint_dir(model_dir, step) / name
    try:
        real = path.resolve(strict=True)
        inside = checkpoint_dir(model_dir.resolve(strict=True), step)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if path.is_symlink() or real.parent != inside or not real.is_file():
        return None
    return real


def open_confined(model_dir: Path, step: int, name: str) -> BinaryIO | None:
    """``confined_file``, opened (without following a link planted since the check): once open, the
    file downloads whole even if checkpoint retention deletes it meanwhile."""
    real = confined_file(model_dir, step, name)
    if real is None:
        return None
    try:
        return os.fdopen(os.open(real, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError:  # gone since the check (retention), or replaced by a link
        return None


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(1 << 20):
            yield chunk


@router.get("/{job_id}/checkpoints")
def checkpoints(job: JobDep, service: ServiceDep) -> CheckpointList:
    """Complete checkpoints, by step. A checkpoint none of whose files may be served (one whose directory
    is a link elsewhere) is not listed: a client could only make an empty directory of it."""
    model_dir, listed = Path(job.model_dir), []
    for c in service.checkpoints(job.id):
        files = [CheckpointFile(**f) for f in c["files"] if confined_file(model_dir, c["step"], f["name"])]
        if files:
            listed.append(Checkpoint(step=c["step"], files=files))
    return CheckpointList(checkpoints=listed)


_FILE = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.get(
    "/{job_id}/checkpoints/{step}/files/{name}",
    response_class=FileResponse,
    responses={200: {"description": "the file's bytes", "content": _FILE}},
)
def checkpoint_file(job: JobDep, service: ServiceDep, step: int, name: str) -> FileResponse:
    missing = ApiError(404, "not_found", f"job {job.id} has no checkpoint file {name!r} at step {step}")
    try:
        service.checkpoint_file(job.id, step, name)  # only names a complete checkpoint lists
    except KeyError as e:
        raise missing from e
    f = open_confined(Path(job.model_dir), step, name)
    if f is None:
        raise missing
    headers = {
        "Content-Length": str(os.fstat(f.fileno()).st_size),
        "Content-Disposition": f"attachment; filename*=utf-8''{quote(name)}",
    }
    return StreamingResponse(_chunks(f), media_type="application/octet-stream", headers=headers)

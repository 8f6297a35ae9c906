"""/v1/jobs/{job_id}/events: a job's events as server-sent events, live while it runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS
from weightstream.jobs.store import Job

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)

POLL_S = 0.25  # how often a follower looks for new events
KEEPALIVE_S = 5.0  # a comment line after this much quiet lets clients check their deadlines


@router.get("/{job_id}/events", response_class=StreamingResponse)
async def events(
    job: Annotated[Job, Depends(existing_job)],
    service: ServiceDep,
    after: Annotated[int, Query(ge=0)] = 0,
    follow: bool = True,
) -> StreamingResponse:
    """Server-sent events: status changes, logged steps, evals, checkpoints. With ``follow`` the
    stream stays open until the job has finished."""
    job_id = job.id

    async def stream() -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        seq, quiet_since = after, loop.time()
        while True:
            for e in service.store.events(job_id, after=seq):
                seq = e["seq"]
                data = json.dumps({**e["data"], "at": e["at"]})
                yield f"id: {seq}\nevent: {e['kind']}\ndata: {data}\n\n"
                quiet_since = loop.time()
            finished = service.is_terminal(job_id) and not service.store.events(job_id, after=seq)
            if not follow or finished:
                return
            if loop.time() - quiet_since > KEEPALIVE_S:
                yield ": keepalive\n\n"
                quiet_since = loop.time()
            await asyncio.sleep(POLL_S)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

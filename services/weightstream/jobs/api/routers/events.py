"""/v1/jobs/{job_id}/events: a job's events as server-sent events, live while it runs.

A follower waits on the store's feed (``notify.follow``), not in a polling loop, and reads SQLite in a
worker thread, so hundreds of open streams cost the event loop nothing while the jobs are quiet.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from weightstream.jobs.api.deps import ServiceDep, authorize, existing_job
from weightstream.jobs.api.errors import ERRORS
from weightstream.jobs.notify import follow as follow_job
from weightstream.jobs.store import Job, event_json

__all__ = ["KEEPALIVE_S", "router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(authorize)], responses=ERRORS)

MAX_SEQ = (1 << 63) - 1  # SQLite's largest integer
# A comment line after this much quiet lets clients check their deadlines, and lets the server notice a
# client that has gone away (the write fails) on a job that says nothing for hours.
KEEPALIVE_S = 5.0


@router.get("/{job_id}/events", response_class=StreamingResponse)
async def events(
    job: Annotated[Job, Depends(existing_job)],
    service: ServiceDep,
    # an event's seq is an SQLite integer: a larger ``after`` is a 422, not a query that overflows mid-stream
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    follow: bool = True,
) -> StreamingResponse:
    """Server-sent events: status changes, logged steps, evals, checkpoints; ``data`` is strict JSON
    (a non-finite number is null). With ``follow`` the stream stays open until the job has finished."""
    store = service.store
    read = functools.partial(store.tail, job.id)

    async def stream() -> AsyncIterator[str]:
        async for e in follow_job(store.feed, job.id, read, after=after, live=follow, idle_s=KEEPALIVE_S):
            if e is None:
                yield ": keepalive\n\n"
            else:
                yield f"id: {e['seq']}\nevent: {e['kind']}\ndata: {event_json(e)}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

"""FastAPI dependencies shared by the routers: the service, bearer-token auth, the job a path names.

``create_app`` puts the ``JobService`` and the token on ``app.state``; routes get them from here, so a
router module needs no closure over either.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from weightstream.jobs.api.errors import ApiError
from weightstream.jobs.service import JobService
from weightstream.jobs.store import Job, UnknownJob

__all__ = ["ServiceDep", "authorize", "existing_job", "get_service"]

_bearer = HTTPBearer(auto_error=False)  # missing credentials are our 401, in our error shape


def get_service(request: Request) -> JobService:
    service: JobService = request.app.state.service
    return service


ServiceDep = Annotated[JobService, Depends(get_service)]


def authorize(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Every /v1 route: ``Authorization: Bearer <token>``, compared in constant time."""
    token: str = request.app.state.token
    given = creds.credentials.encode() if creds is not None else b""
    if not hmac.compare_digest(given, token.encode()):
        raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")


def existing_job(job_id: str, service: ServiceDep) -> Job:
    """The job the path names, or 404."""
    try:
        return service.store.get(job_id)
    except UnknownJob as e:
        raise ApiError(404, "not_found", str(e)) from e

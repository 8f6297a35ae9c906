"""FastAPI dependencies shared by the routers: the service, bearer-token auth, the job a path names, and
the finite-numbers rule for JSON bodies.

``create_app`` puts the ``JobService`` and the token on ``app.state``; routes get them from here, so a
router module needs no closure over either.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from weightstream.jobs.api.edge import UNAUTHORIZED, bearer_matches
from weightstream.jobs.api.errors import ApiError
from weightstream.jobs.service import JobService
from weightstream.jobs.store import Job, UnknownJob

__all__ = ["ServiceDep", "authorize", "existing_job", "finite_json_body", "first_non_finite", "get_service"]

_bearer = HTTPBearer(auto_error=False)  # missing credentials are our 401, in our error shape


def get_service(request: Request) -> JobService:
    service: JobService = request.app.state.service
    return service


ServiceDep = Annotated[JobService, Depends(get_service)]


def authorize(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Every /v1 route: ``Authorization: Bearer <token>``. ``EdgeGuard`` has already refused a request
    without it, before its body was read; this dependency documents the scheme in OpenAPI and checks
    again, so a route stays closed even in an app assembled without the guard."""
    if not bearer_matches(request.headers.get("authorization"), request.app.state.token):
        raise ApiError(401, "unauthorized", UNAUTHORIZED)


def existing_job(job_id: str, service: ServiceDep) -> Job:
    """The job the path names, or 404."""
    try:
        return service.store.get(job_id)
    except UnknownJob as e:
        raise ApiError(404, "not_found", str(e)) from e


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


async def finite_json_body(request: Request) -> None:
    """Every JSON body: no NaN, Infinity or -Infinity anywhere, else 422 naming the first such field.

    JSON (RFC 8259) has no such numbers, but Python's ``json`` reads them, and ``params`` is free-form
    until the params validation, whose problem report carries the offending value: a NaN there cannot
    be written back as JSON, and the 422 became a 500. Checked on the body FastAPI has already parsed
    (``Request.json`` caches it), before any route runs."""
    if request.method not in _BODY_METHODS or "json" not in request.headers.get("content-type", "").lower():
        return
    try:
        body = await request.json()
    except ValueError:  # not JSON at all: the route's own body validation says so, in detail
        return
    path = first_non_finite(body)
    if path is not None:
        where = ".".join(("body", *path))
        raise ApiError(
            422,
            "invalid_request",
            f"the request does not match the API's schema: {where} is not a finite number",
            [{"path": where, "message": "must be a finite number (JSON has no NaN or Infinity)"}],
        )


def first_non_finite(document: Any) -> tuple[str, ...] | None:
    """The key path of the first NaN or ±Infinity in a parsed JSON document (list indexes as strings),
    in document order; None if every number is finite. Iterative: a deeply nested body that ``json``
    accepted must not overflow the stack here."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path
        if isinstance(value, dict):
            children = [((*path, str(k)), v) for k, v in value.items()]
        elif isinstance(value, list):
            children = [((*path, str(i)), v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(children))  # popped in document order
    return None

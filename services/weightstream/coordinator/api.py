"""The REST API (FastAPI): a thin translation of HTTP to ``JobService``. Versioned under /v1.

Every /v1 route needs ``Authorization: Bearer <token>`` (compared in constant time). Errors are JSON
``{"error": {"code", "message", "details"?}}``; invalid params are 422 with every problem's key path.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from weightstream import __version__
from weightstream.coordinator.jobstore import TRANSITIONS, IllegalTransition, Job, UnknownJob
from weightstream.coordinator.service import CapacityError, JobService
from weightstream.params import ParamsError

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 1 << 20
# module level: route signatures are resolved in the module's namespace (postponed annotations)
_bearer = HTTPBearer(
    auto_error=False
)  # a params file is a few KiB; anything near this is a mistake or an attack
Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


# -- models at the edge ------------------------------------------------------------------------------------
class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params: dict[str, Any] = Field(description="the params file (ModelZoo layout) as a JSON object")
    num_csx: int = Field(ge=1, le=1024, description="CS-2 workers; overrides runconfig.num_csx")
    labels: dict[str, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict, max_length=32)
    priority: int = Field(default=2, ge=1, le=3, description="1 runs before 2 before 3")


class HistoryEntry(BaseModel):
    status: Status
    at: float
    reason: str | None = None


class JobView(BaseModel):
    id: str
    status: Status
    num_csx: int
    labels: dict[str, str]
    priority: int
    created_at: float
    updated_at: float
    error: str | None
    history: list[HistoryEntry]
    params: dict[str, Any]

    @staticmethod
    def of(job: Job) -> JobView:
        return JobView(
            id=job.id,
            status=job.status,
            num_csx=job.num_csx,
            labels=job.labels,
            priority=job.priority,
            created_at=job.created_at,
            updated_at=job.updated_at,
            error=job.error,
            history=[HistoryEntry(**h) for h in job.history],
            params=job.params,
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


def _error(
    status: int,
    code: str,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, details=details))
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


def _err_doc(description: str) -> dict[str, Any]:
    # content given explicitly: otherwise FastAPI documents an error under the route's own media type
    # (text/plain, a file, an event stream), but errors are always JSON
    return {"model": ErrorBody, "description": description, "content": {"application/json": {}}}


ERRORS: dict[int | str, dict[str, Any]] = {
    401: _err_doc("missing or wrong bearer token"),
    404: _err_doc("no such job"),
    413: _err_doc("request body too large"),
    422: _err_doc("the request does not match the schema"),
}


def create_app(service: JobService, token: str) -> FastAPI:
    app = FastAPI(
        title="weightstream",
        version=__version__,
        description="Submit, follow, cancel and download training jobs on a weightstream appliance.",
    )

    def authorize(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        given = creds.credentials.encode() if creds is not None else b""
        if not hmac.compare_digest(given, token.encode()):
            raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")

    def job_or_404(job_id: str) -> Job:
        try:
            return service.store.get(job_id)
        except UnknownJob as e:
            raise ApiError(404, "not_found", str(e)) from e

    # -- errors: always the same JSON shape ----------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return _error(e.status, e.code, e.message, e.details, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        details = [
            {"path": ".".join(str(p) for p in err["loc"]), "message": err["msg"]} for err in e.errors()
        ]
        return _error(422, "invalid_request", "the request does not match the API's schema", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(e.status_code, "http_error", str(e.detail))

    @app.middleware("http")
    async def _limit_body(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return _error(413, "too_large", f"request bodies are limited to {MAX_BODY_BYTES} bytes")
        return await call_next(request)

    # -- open routes ---------------------------------------------------------------------------------------
    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    registry = CollectorRegistry()
    _register_metrics(registry, service)

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    # -- jobs ----------------------------------------------------------------------------------------------
    v1 = [Depends(authorize)]

    @app.post(
        "/v1/jobs",
        status_code=201,
        dependencies=v1,
        tags=["jobs"],
        responses={**ERRORS, 422: _err_doc("invalid params (every problem's key path in details)")},
    )
    def submit(req: SubmitRequest) -> JobView:
        try:
            return JobView.of(service.submit(req.params, req.num_csx, req.labels, req.priority))
        except ParamsError as e:
            raise ApiError(422, "invalid_params", str(e), [p.as_dict() for p in e.problems]) from e
        except CapacityError as e:
            raise ApiError(422, "over_capacity", str(e)) from e

    @app.get("/v1/jobs", dependencies=v1, tags=["jobs"], responses=ERRORS)
    def list_jobs(
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

    @app.get("/v1/jobs/{job_id}", dependencies=v1, tags=["jobs"], responses=ERRORS)
    def get_job(job_id: str) -> JobView:
        return JobView.of(job_or_404(job_id))

    @app.delete(
        "/v1/jobs/{job_id}",
        dependencies=v1,
        tags=["jobs"],
        responses={**ERRORS, 409: _err_doc("the job has already finished")},
    )
    def cancel(job_id: str) -> JobView:
        job_or_404(job_id)
        try:
            return JobView.of(service.cancel(job_id))
        except IllegalTransition as e:
            raise ApiError(409, "conflict", str(e)) from e

    @app.get("/v1/jobs/{job_id}/metrics", dependencies=v1, tags=["jobs"], responses=ERRORS)
    def job_metrics(job_id: str) -> Metrics:
        job_or_404(job_id)
        return Metrics(**service.metrics(job_id))

    @app.get(
        "/v1/jobs/{job_id}/logs",
        dependencies=v1,
        tags=["jobs"],
        responses=ERRORS,
        response_class=PlainTextResponse,
    )
    def logs(job_id: str, tail: Annotated[int | None, Query(ge=1, le=100_000)] = None) -> PlainTextResponse:
        job_or_404(job_id)
        return PlainTextResponse(service.logs(job_id, tail))

    @app.get(
        "/v1/jobs/{job_id}/events",
        dependencies=v1,
        tags=["jobs"],
        responses=ERRORS,
        response_class=StreamingResponse,
    )
    async def events(
        job_id: str, after: Annotated[int, Query(ge=0)] = 0, follow: bool = True
    ) -> StreamingResponse:
        """Server-sent events: status changes, logged steps, evals, checkpoints. With ``follow`` the
        stream stays open until the job has finished."""
        job_or_404(job_id)

        async def stream() -> AsyncIterator[str]:
            seq = after
            quiet_since = asyncio.get_running_loop().time()
            while True:
                for e in service.store.events(job_id, after=seq):
                    seq = e["seq"]
                    data = json.dumps({**e["data"], "at": e["at"]})
                    yield f"id: {seq}\nevent: {e['kind']}\ndata: {data}\n\n"
                    quiet_since = asyncio.get_running_loop().time()
                finished = service.is_terminal(job_id) and not service.store.events(job_id, after=seq)
                if not follow or finished:
                    return
                if (
                    asyncio.get_running_loop().time() - quiet_since > 5.0
                ):  # lets clients check their deadlines
                    yield ": keepalive\n\n"
                    quiet_since = asyncio.get_running_loop().time()
                await asyncio.sleep(0.25)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.get("/v1/jobs/{job_id}/checkpoints", dependencies=v1, tags=["jobs"], responses=ERRORS)
    def checkpoints(job_id: str) -> CheckpointList:
        job_or_404(job_id)
        return CheckpointList(checkpoints=[Checkpoint(**c) for c in service.checkpoints(job_id)])

    @app.get(
        "/v1/jobs/{job_id}/checkpoints/{step}/files/{name}",
        dependencies=v1,
        tags=["jobs"],
        responses=ERRORS,
        response_class=FileResponse,
    )
    def checkpoint_file(job_id: str, step: int, name: str) -> FileResponse:
        job_or_404(job_id)
        try:
            path = service.checkpoint_file(job_id, step, name)
        except KeyError as e:
            raise ApiError(404, "not_found", e.args[0]) from e
        return FileResponse(path, filename=name, media_type="application/octet-stream")

    return app


def _register_metrics(registry: CollectorRegistry, service: JobService) -> None:
    class Jobs:
        def collect(self) -> Any:
            g = GaugeMetricFamily("weightstream_jobs", "jobs by status", labels=["status"])
            counts = {s: 0 for s in TRANSITIONS}
            for job in service.store.list():
                counts[job.status] += 1
            for status, n in counts.items():
                g.add_metric([status], n)
            yield g
            running = [j for j in service.store.list(status="running")]
            steps = GaugeMetricFamily(
                "weightstream_job_step", "last step of each running job", labels=["job"]
            )
            tps = GaugeMetricFamily(
                "weightstream_job_tokens_per_second", "tokens/s of each running job", labels=["job"]
            )
            step_time = GaugeMetricFamily(
                "weightstream_job_step_time_seconds", "last step time", labels=["job"]
            )
            for job in running:
                last = service.store.last_event(job.id, "step")
                if last:
                    d = last["data"]
                    steps.add_metric([job.id], d["step"])
                    tps.add_metric([job.id], d["tokens_per_second"])
                    step_time.add_metric([job.id], d["step_time_s"])
            yield from (steps, tps, step_time)

    registry.register(Jobs())  # type: ignore[arg-type]
    Gauge("weightstream_slots", "CS-2 slots of this service", registry=registry).set(service.config.slots)

"""``create_app``: the REST API (FastAPI) over a ``JobService``, versioned under /v1.

Every /v1 route needs ``Authorization: Bearer <token>`` (compared in constant time, from the headers,
before any byte of the body is read) and every body is limited to ``MAX_BODY_BYTES``, counted as it
streams: both are ``edge.EdgeGuard``. Errors are JSON ``{"error": {"code", "message", "details"?}}``;
invalid params are 422 with every problem's key path. The routes live in ``routers/``, one module per
resource (``dashboard``: the web page at /, open like /healthz); this module only assembles them.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI
from prometheus_client import CollectorRegistry

from weightstream import __version__
from weightstream.jobs.api.deps import finite_json_body
from weightstream.jobs.api.edge import EdgeGuard
from weightstream.jobs.api.errors import install_error_handlers
from weightstream.jobs.api.routers import checkpoints, dashboard, events, jobs, service
from weightstream.jobs.metrics import register_metrics
from weightstream.jobs.service import JobService

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 1 << 20  # a params file is a few KiB; anything near this is a mistake or an attack


def create_app(job_service: JobService, token: str) -> FastAPI:
    """The API of ``job_service``; every /v1 route requires ``token``."""
    app = FastAPI(
        title="weightstream",
        version=__version__,
        description="Submit, follow, cancel and download training jobs on a weightstream appliance.",
        dependencies=[Depends(finite_json_body)],
    )
    app.state.service, app.state.token = job_service, token
    app.state.registry = CollectorRegistry()
    register_metrics(app.state.registry, job_service)
    install_error_handlers(app)
    app.add_middleware(EdgeGuard, token=token, max_body_bytes=MAX_BODY_BYTES)
    for module in (service, jobs, events, checkpoints, dashboard):
        app.include_router(module.router)
    return app

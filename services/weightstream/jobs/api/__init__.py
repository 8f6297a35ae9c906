"""The REST API of the job service (FastAPI): ``create_app`` assembles the routers.

``edge`` (authentication before the body, the streaming body limit: pure ASGI), ``views`` (pydantic
bodies), ``errors`` (one JSON error shape), ``deps`` (auth for OpenAPI, finite JSON, the service, the job a
path names), ``routers/`` (one module per resource), ``server`` (uvicorn until SIGTERM, then the jobs
requeued).
"""

from weightstream.jobs.api.app import MAX_BODY_BYTES, create_app

__all__ = ["MAX_BODY_BYTES", "create_app"]

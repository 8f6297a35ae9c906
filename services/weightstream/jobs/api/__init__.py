"""The REST API of the job service (FastAPI): ``create_app`` assembles the routers.

``views`` (pydantic bodies), ``errors`` (one JSON error shape), ``deps`` (auth, the service, the job a
path names), ``routers/`` (one module per resource).
"""

from weightstream.jobs.api.app import MAX_BODY_BYTES, create_app

__all__ = ["MAX_BODY_BYTES", "create_app"]

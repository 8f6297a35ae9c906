"""The open routes: /healthz and Prometheus' /metrics (no token: probes and scrapers have none)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest

from weightstream import __version__

__all__ = ["router"]

router = APIRouter(tags=["service"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    registry: CollectorRegistry = request.app.state.registry
    return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

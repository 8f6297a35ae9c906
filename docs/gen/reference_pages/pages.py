"""The reference pages, by their path in the site: each a function that builds what it reads from the
code (the click trees, the REST app, the metrics registry, the params models) and renders it."""

from __future__ import annotations

from collections.abc import Callable

from reference_pages.api import api_page
from reference_pages.cli import cli_page
from reference_pages.metrics import metrics_page, sample_service
from reference_pages.params import params_page

__all__ = ["PAGES", "rest_app", "service_cli", "wsctl_cli"]


def service_cli() -> object:
    """The ``weightstream`` command's click tree."""
    import typer

    from weightstream.cli import app

    return typer.main.get_command(app)


def wsctl_cli() -> object:
    """The ``wsctl`` command's click tree."""
    import typer

    from weightstream_client.cli import app

    return typer.main.get_command(app)


def rest_app() -> object:
    """The REST app as ``weightstream serve`` assembles it, over a stand-in service (OpenAPI reads only
    the routes)."""
    from weightstream.jobs.api.app import create_app

    return create_app(sample_service(), token="reference")


def _metrics() -> str:
    from prometheus_client import CollectorRegistry

    from weightstream.jobs.metrics import register_metrics

    registry = CollectorRegistry()
    register_metrics(registry, sample_service())
    return metrics_page(registry)


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": lambda: cli_page(service_cli(), "weightstream", "weightstream CLI"),
    "reference/wsctl.md": lambda: cli_page(wsctl_cli(), "wsctl", "wsctl CLI"),
    "reference/params.md": params_page,
    "reference/rest-api.md": lambda: api_page(rest_app().openapi()),  # type: ignore[attr-defined]
    "reference/metrics.md": _metrics,
}

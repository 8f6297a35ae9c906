"""The Prometheus metrics page: every metric family the service's ``/metrics`` exports, read from a
registry that ``register_metrics`` filled, as a scrape would see it.

The job collector reads the job store at each scrape and yields one series per running job; a stand-in
service with one job of each status and one logged step makes every family and every label show, without
a job store or a scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from reference_pages._markdown import code, table, text

__all__ = ["Family", "families", "metrics_page", "sample_service"]

# name, type, help, {label: its values in the sample scrape}, exposed series names
Family = tuple[str, str, str, dict[str, tuple[str, ...]], tuple[str, ...]]


class _Store:
    """A job store holding one job per status, the running one with a logged step."""

    def __init__(self, statuses: Iterable[str]) -> None:
        self.jobs = [SimpleNamespace(id=f"job-{s}", status=s) for s in statuses]

    def list(self, status: str | None = None, labels: Any = None) -> list[Any]:
        return [j for j in self.jobs if status is None or j.status == status]

    def last_event(self, job_id: str, kind: str) -> dict[str, Any]:
        return {"data": {"step": 1, "tokens_per_second": 1.0, "step_time_s": 1.0}}

    def role_restarts(self, job_id: str | None = None, by: str = "role_kind") -> dict[str, int]:
        return {}


def sample_service() -> Any:
    """A stand-in ``JobService`` for ``register_metrics``: one CS-2 slot, one job of every status."""
    from weightstream.jobs.store import TRANSITIONS

    return SimpleNamespace(store=_Store(TRANSITIONS), config=SimpleNamespace(slots=1))


def families(registry: CollectorRegistry) -> list[Family]:
    """(name, type, help, labels, exposed series names) of every family ``registry`` collects."""
    out = []
    for metric in registry.collect():
        labels: dict[str, tuple[str, ...]] = {}
        for sample in metric.samples:
            for key, value in sample.labels.items():
                labels[key] = (*labels.get(key, ()), value)
        series = tuple(dict.fromkeys(s.name for s in metric.samples))
        out.append((metric.name, metric.type, metric.documentation, labels, series))
    return out


def _label(key: str, values: tuple[str, ...]) -> str:
    """A label, with its values where they are a fixed set (not the per-job label, a job id)."""
    if key == "job":
        return f"{code(key)} (the job id)"
    return f"{code(key)}: {', '.join(code(v) for v in dict.fromkeys(values))}"


def metrics_page(registry: CollectorRegistry) -> str:
    """The markdown page of the families ``registry`` exports (see ``families``)."""
    rows = [
        [
            "<br>".join(code(s) for s in series) or code(name),
            type_,
            "<br>".join(_label(key, values) for key, values in labels.items()),
            text(help_, cell=True),
        ]
        for name, type_, help_, labels, series in families(registry)
    ]
    intro = (
        "`weightstream serve` exports these at `GET /metrics` (no token: scrapers have none), in "
        "Prometheus' text format. The job families are read from the job store at each scrape, so they "
        "are never stale; the per-job ones (label `job`) have one series per running job.\n"
    )
    return "\n".join(["# Prometheus metrics\n", intro, table(["Metric", "Type", "Labels", "Meaning"], rows)])

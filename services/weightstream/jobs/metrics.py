"""Prometheus metrics of the job service: jobs by status, slots, each running job's last step, and role
replacements by role kind and by how the role was lost (fault recovery)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from weightstream.jobs.service import JobService
from weightstream.jobs.store import TRANSITIONS
from weightstream.plan import ROLE_KINDS
from weightstream.training.events import FaultKind

__all__ = ["register_metrics"]


class JobsCollector(Collector):
    """Read from the job store at each scrape, so the numbers are never stale."""

    def __init__(self, service: JobService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("weightstream_jobs", "jobs by status", labels=["status"])
        counts = dict.fromkeys(TRANSITIONS, 0)
        for job in self.service.store.list():
            counts[job.status] += 1
        for status, n in counts.items():
            g.add_metric([status], n)
        yield g
        steps = GaugeMetricFamily("weightstream_job_step", "last step of each running job", labels=["job"])
        tps = GaugeMetricFamily(
            "weightstream_job_tokens_per_second", "tokens/s of each running job", labels=["job"]
        )
        step_time = GaugeMetricFamily("weightstream_job_step_time_seconds", "last step time", labels=["job"])
        for job in self.service.store.list(status="running"):
            last = self.service.store.last_event(job.id, "step")  # one indexed query per running job
            if last:
                d = last["data"]
                steps.add_metric([job.id], d["step"])
                tps.add_metric([job.id], d["tokens_per_second"])
                step_time.add_metric([job.id], d["step_time_s"])
        yield from (steps, tps, step_time)
        yield self._restarts()
        yield self._faults()

    def _restarts(self) -> CounterMetricFamily:
        """Counted from the stored restart events, not in memory: the counter survives a service restart
        (it only grows, as the events are never deleted) and a crash loses none. Every kind is present,
        0 included, so that an alert on ``increase(...)`` has a series before the first fault."""
        return self._replacements(
            "weightstream_role_restarts",  # exposed with the counter's suffix: ..._total
            "roles replaced by fault recovery, over every job, by role kind",
            ("kind", "role_kind", ROLE_KINDS),
        )

    def _faults(self) -> CounterMetricFamily:
        """The same replacements by how the role was lost (``died``: its process ended; ``hung``: it
        stopped answering, stopped or cut off, and was killed), every fault kind present from the start."""
        return self._replacements(
            "weightstream_role_faults",
            "roles lost and replaced by fault recovery, over every job, by how they were lost",
            ("fault", "fault", get_args(FaultKind)),
        )

    def _replacements(
        self, name: str, documentation: str, label: tuple[str, str, tuple[str, ...]]
    ) -> CounterMetricFamily:
        """The stored restart events counted by one of their fields: ``label`` is (the label's name, the
        event field, every value it takes, each present from the start)."""
        label_name, field, values = label
        counts: dict[str, int] = dict.fromkeys(values, 0)
        counts.update(self.service.store.role_restarts(by=field))
        family = CounterMetricFamily(name, documentation, labels=[label_name])
        for value, n in counts.items():
            family.add_metric([value], n)
        return family


def register_metrics(registry: CollectorRegistry, service: JobService) -> None:
    registry.register(JobsCollector(service))
    Gauge("weightstream_slots", "CS-2 slots of this service", registry=registry).set(service.config.slots)

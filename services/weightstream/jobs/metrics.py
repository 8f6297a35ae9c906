"""Prometheus metrics of the job service: jobs by status, slots, and each running job's last step."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from weightstream.jobs.service import JobService
from weightstream.jobs.store import TRANSITIONS

__all__ = ["register_metrics"]


class JobsCollector(Collector):
    """Read from the job store at each scrape, so the numbers are never stale."""

    def __init__(self, service: JobService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
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


def register_metrics(registry: CollectorRegistry, service: JobService) -> None:
    registry.register(JobsCollector(service))
    Gauge("weightstream_slots", "CS-2 slots of this service", registry=registry).set(service.config.slots)

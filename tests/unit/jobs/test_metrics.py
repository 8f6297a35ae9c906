"""/metrics' role-restart counter, read from the job store: every kind present, counted from the stored
events (so a restarted service counts the same), with one query that reads only restart events."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from weightstream.jobs.metrics import JobsCollector
from weightstream.jobs.service import JobService
from weightstream.jobs.store import JobStore


def _scrape(store: JobStore) -> str:
    registry = CollectorRegistry()
    # the collector only reads the service's store: a stand-in keeps the scheduler (and jobs) out of it
    registry.register(JobsCollector(cast(JobService, SimpleNamespace(store=store))))
    return generate_latest(registry).decode()


def _restart(store: JobStore, job_id: str, kind: str, n: int) -> None:
    store.add_event(
        job_id,
        "restart",
        {"role": f"{kind}-0", "role_kind": kind, "step": 3, "reason": "killed", "restarts": n},
    )


def test_role_restarts_count_stored_restart_events_by_kind_and_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    store = JobStore(path)
    for job_id in ("a", "b"):
        store.create(job_id, {}, 1, {}, 2, tmp_path / job_id)
    text = _scrape(store)
    for kind in ("worker", "swarmx", "memoryx", "activation"):  # present before any fault
        assert f'weightstream_role_restarts_total{{kind="{kind}"}} 0.0' in text, text
    _restart(store, "a", "worker", 1)
    _restart(store, "a", "worker", 2)
    _restart(store, "b", "memoryx", 1)
    for kind, data in (("step", {"step": 3}), ("recovered", {"step": 2, "restarts": 2}), ("retry", {})):
        store.add_event("a", kind, data)  # other events, the recovery's included, are not restarts
    assert store.role_restarts() == {"worker": 2, "memoryx": 1}
    assert store.role_restarts("a") == {"worker": 2} and store.role_restarts("b") == {"memoryx": 1}
    store.close()
    store = JobStore(path)  # as a restarted service opens it: the counter goes on from the events
    text = _scrape(store)
    expected = {"worker": 2, "memoryx": 1, "swarmx": 0, "activation": 0}
    for kind, n in expected.items():
        assert f'weightstream_role_restarts_total{{kind="{kind}"}} {n}.0' in text, text
    store.close()


def test_role_faults_count_restarts_by_how_the_role_was_lost(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    store.create("a", {}, 1, {}, 2, tmp_path / "a")
    text = _scrape(store)
    for fault in ("died", "hung"):  # present before any fault
        assert f'weightstream_role_faults_total{{fault="{fault}"}} 0.0' in text, text
    _restart(store, "a", "worker", 1)  # stored before events said how: counted as died
    for n, fault in enumerate(("hung", "died", "hung"), start=2):
        data = {"role": "swarmx-0", "role_kind": "swarmx", "step": 3, "restarts": n, "fault": fault}
        store.add_event("a", "restart", data)
    assert store.role_restarts(by="fault") == {"died": 2, "hung": 2}
    text = _scrape(store)
    assert 'weightstream_role_faults_total{fault="hung"} 2.0' in text, text
    assert 'weightstream_role_faults_total{fault="died"} 2.0' in text, text
    with pytest.raises(ValueError, match="role_kind or fault"):
        store.role_restarts(by="data")  # the name goes into the query: only the two are taken
    store.close()


def test_counting_restarts_reads_only_restart_events(tmp_path: Path) -> None:
    """A scrape every few seconds must not scan a table with one row per step of every job ever run."""
    store = JobStore(tmp_path / "jobs.sqlite")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # the SQL role_restarts() really runs
    store.role_restarts()
    store._db.set_trace_callback(None)
    assert len(statements) == 1, statements  # one grouped query per scrape, not one per job
    plan = store._db.execute(f"EXPLAIN QUERY PLAN {statements[0]}").fetchall()
    assert any("USING INDEX events_restart" in row[-1] for row in plan), plan
    store.close()

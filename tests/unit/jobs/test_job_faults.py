"""``JobView.faults`` (GET a job; ``wsctl get job``) from a job's stored events: the roles replaced by kind,
the worker count and why it last changed, and the newest straggler warning."""

from __future__ import annotations

from pathlib import Path

from weightstream.jobs.api.views import JobFaults
from weightstream.jobs.store import JobStore


def test_faults_come_from_the_newest_events_of_each_kind(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        job = store.create("a", {}, 3, {}, 2, tmp_path / "a")
        assert JobFaults.of(job, store) == JobFaults(restarts={}, workers=3)
        store.add_event("a", "restart", {"role": "worker-1", "role_kind": "worker", "step": 5})
        store.add_event("a", "workers", {"step": 6, "from_workers": 3, "to_workers": 2, "reason": "no room"})
        for step, ratio in ((12, 2.04), (30, 4.31)):
            slow = {"step": step, "worker": "worker-1", "host": "h2", "ratio": ratio, "steps": 3}
            store.add_event("a", "straggler", slow)
        faults = JobFaults.of(job, store)
        assert faults.restarts == {"worker": 1} and faults.workers == 2
        assert faults.last_workers_change == "no room"
        assert faults.last_straggler == "step 30: worker-1 on h2, 4.3x the others for 3 steps"
    finally:
        store.close()

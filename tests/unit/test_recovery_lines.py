"""A fault recovery as the client shows it: the progress lines (``recovery_line``: the host a lost role ran
on and what the recovery did, where the service's events say; older events without them still read), and
``wsctl get job``'s lines under the job's row (``faults_text``: restarts by kind, the workers it trains
with)."""

from __future__ import annotations

from weightstream_client._format import faults_text
from weightstream_client._progress import recovery_line


def test_a_restart_names_the_host_the_role_was_lost_on() -> None:
    e = {"kind": "restart", "step": 21, "restarts": 1, "max_role_restarts": 50, "fault": "hung"}
    reason = "worker-1 did not answer (hung); killed"
    assert (
        recovery_line({**e, "reason": reason, "host": "h3"}) == f"step 21  restart 1/50: {reason} (host h3)"
    )
    assert recovery_line({**e, "reason": reason}) == f"step 21  restart 1/50: {reason}"


def test_a_recovery_says_what_was_done() -> None:
    e = {"kind": "recovered", "step": 20, "replay_steps": 0, "recovery_s": 0.42}
    action = "replaced memoryx-0; memoryx-0 failed over to its replica"
    assert (
        recovery_line({**e, "action": action}) == f"step 20  recovered in 0.4s (replaying 0 steps): {action}"
    )
    assert recovery_line({**e, "replay_steps": 1}) == "step 20  recovered in 0.4s (replaying 1 step)"
    assert recovery_line({"kind": "step", "step": 3}) is None


def test_a_change_of_the_worker_count_says_from_what_to_what_and_why() -> None:
    e = {"kind": "workers", "step": 6, "from_workers": 3, "to_workers": 2}
    why = "no capacity to start worker-1 again within 30s"
    assert recovery_line({**e, "reason": why}) == f"step 6  workers 3 -> 2: {why}"


def test_get_job_shows_restarts_by_kind_and_fewer_workers_with_why() -> None:
    faults = {
        "restarts": {"worker": 2, "memoryx": 1},
        "workers": 2,
        "last_workers_change": "worker-1: no room",
    }
    assert faults_text(faults, 3) == (
        "RESTARTS   3 (memoryx 1, worker 2)\nWORKERS    2 of 3   (last change: worker-1: no room)\n"
    )
    assert faults_text({"restarts": {}, "workers": 3}, 3) == "RESTARTS   0\nWORKERS    3 of 3\n"


def test_get_job_shows_the_newest_straggler_warning() -> None:
    slow = "step 30: worker-1 on h2, 4.3x the others for 3 steps"
    faults = {"restarts": {}, "workers": 2, "last_straggler": slow}
    assert faults_text(faults, 2) == f"RESTARTS   0\nWORKERS    2 of 2\nSTRAGGLER  {slow}\n"


def test_a_straggler_event_reads_as_one_line() -> None:
    e = {"kind": "straggler", "step": 30, "worker": "worker-1", "host": "h2", "ratio": 4.31, "steps": 3}
    assert recovery_line(e) == "step 30  straggler: worker-1 on h2 4.3x the other workers' median for 3 steps"

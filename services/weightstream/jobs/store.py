"""The job store: every job the service has accepted, in SQLite, written through transactions.

A job's record holds its resolved params, num_csx, labels, priority, who submitted it, status history
with timestamps, the error if any and its model_dir; its events (status changes, logged steps, evals,
checkpoints) are kept in order so that clients can follow a job from any point. A restarted service finds
every job it had. Every commit is published on ``feed`` (``notify.JobFeed``), which is what followers
wait on.

Event data is strict JSON: a non-finite float (a diverged loss) is stored as null, and one found in a
row written before that rule is read back as null, so neither API can send ``NaN`` or ``Infinity``.
"""

from __future__ import annotations

import builtins
import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightstream.jobs.notify import Event, JobFeed

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "Job",
    "JobFinished",
    "JobStore",
    "UnknownJob",
    "event_json",
    "finite",
]

# queued -> running -> succeeded | failed | cancelled; queued -> cancelled; a restart may requeue a
# running job whose params ask to resume from its last checkpoint.
TRANSITIONS: dict[str, set[str]] = {
    "queued": {"running", "cancelled", "failed"},
    "running": {"succeeded", "failed", "cancelled", "queued"},
    "succeeded": set(),
    "failed": set(),
    "cancelled": set(),
}
TERMINAL = {"succeeded", "failed", "cancelled"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    params TEXT NOT NULL,
    num_csx INTEGER NOT NULL,
    labels TEXT NOT NULL,
    priority INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    error TEXT,
    model_dir TEXT NOT NULL,
    history TEXT NOT NULL,
    user_name TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (status, priority, created_at);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs (id),
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, seq);
-- only restart events (a few per job, against one per step): /metrics counts them at every scrape
CREATE INDEX IF NOT EXISTS events_restart ON events (job_id) WHERE kind = 'restart';
"""


class UnknownJob(KeyError):
    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    def __str__(self) -> str:
        return f"no job {self.job_id!r}"


class IllegalTransition(ValueError):
    def __init__(self, job_id: str, current: str, wanted: str) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none: the job is finished"
        super().__init__(f"job {job_id} is {current}; it cannot become {wanted} (allowed: {allowed})")
        self.current, self.wanted = current, wanted


class JobFinished(ValueError):
    """A change that only a queued or running job takes (its priority), asked of a finished one."""

    def __init__(self, job_id: str, status: str, what: str) -> None:
        super().__init__(f"job {job_id} has finished ({status}): its {what} can no longer change")
        self.status = status


@dataclass(frozen=True)
class Job:
    id: str
    status: str
    params: dict[str, Any]
    num_csx: int
    labels: dict[str, str]
    priority: int
    created_at: float
    updated_at: float
    error: str | None
    model_dir: str
    history: list[dict[str, Any]]  # [{"status", "at", "reason"?}]
    user: str = ""  # who submitted it; "" for a job stored before the service recorded that

    def running_seconds(self, now: float | None = None) -> float:
        """Seconds spent running, over every run (a service restart requeues a job). With ``now``, a run
        still under way counts up to ``now``; without, only runs that have ended count."""
        used, since = 0.0, None
        for h in self.history:
            if h["status"] == "running":
                since = h["at"]
            elif since is not None:
                used, since = used + h["at"] - since, None
        if since is not None and now is not None:
            used += max(0.0, now - since)
        return used


class JobStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # one connection, serialised by a lock: the store is small and writes must be ordered anyway
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed job survives a crash of the machine
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if "user_name" not in columns:  # a store written before jobs recorded who submitted them
            self._db.execute("ALTER TABLE jobs ADD COLUMN user_name TEXT NOT NULL DEFAULT ''")
        self._lock = threading.RLock()
        self.feed = JobFeed()  # published after every commit, for followers of a job

    @contextmanager
    def _tx(self, job_id: str) -> Iterator[sqlite3.Connection]:
        """A write transaction about ``job_id``; once committed, its followers are woken."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        self.feed.publish(job_id)  # outside the lock: waking followers never holds up a writer

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- jobs ----------------------------------------------------------------------------------------------
    def create(
        self,
        job_id: str,
        params: dict[str, Any],
        num_csx: int,
        labels: dict[str, str],
        priority: int,
        model_dir: Path,
        user: str = "",
    ) -> Job:
        now = time.time()
        history = [{"status": "queued", "at": now}]
        with self._tx(job_id) as db:
            db.execute(
                "INSERT INTO jobs (id, status, params, num_csx, labels, priority, created_at, updated_at, "
                "error, model_dir, history, user_name) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
                (
                    job_id,
                    json.dumps(params),
                    num_csx,
                    json.dumps(labels),
                    priority,
                    now,
                    now,
                    str(model_dir),
                    json.dumps(history),
                    user,
                ),
            )
            self._event(db, job_id, "status", {"status": "queued"})
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id)
        return _job(row)

    def list(self, status: str | None = None, labels: dict[str, str] | None = None) -> list[Job]:
        with self._lock:
            if status is None:
                rows = self._db.execute("SELECT * FROM jobs ORDER BY created_at").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM jobs WHERE status = ? ORDER BY created_at", (status,)
                ).fetchall()
        jobs = [_job(r) for r in rows]
        if labels:
            jobs = [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]
        return jobs

    def queue(self) -> builtins.list[Job]:
        """Queued jobs in the order they run: priority (1 first), then submission time."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM jobs WHERE status = 'queued' ORDER BY priority, created_at"
            ).fetchall()
        return [_job(r) for r in rows]

    def set_labels(self, job_id: str, labels: dict[str, str]) -> Job:
        """Replace a job's labels (any status: labels describe, they change nothing of the run)."""
        with self._tx(job_id) as db:
            updated = db.execute(
                "UPDATE jobs SET labels = ?, updated_at = ? WHERE id = ?",
                (json.dumps(labels), time.time(), job_id),
            ).rowcount
        if not updated:
            raise UnknownJob(job_id)
        return self.get(job_id)

    def set_priority(self, job_id: str, priority: int) -> Job:
        """Set the priority of a queued or running job (a running one keeps it if it is requeued); a
        finished job raises JobFinished. Checked and written in one transaction: a job that ends
        meanwhile is never changed."""
        with self._tx(job_id) as db:
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJob(job_id)
            if row[0] in TERMINAL:
                raise JobFinished(job_id, row[0], "priority")
            db.execute(
                "UPDATE jobs SET priority = ?, updated_at = ? WHERE id = ?", (priority, time.time(), job_id)
            )
        return self.get(job_id)

    def transition(
        self, job_id: str, status: str, reason: str | None = None, error: str | None = None
    ) -> Job:
        """Move a job to ``status`` if the state machine allows it (raises IllegalTransition if not)."""
        with self._tx(job_id) as db:
            row = db.execute("SELECT status, history FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJob(job_id)
            current, history = row[0], json.loads(row[1])
            if status not in TRANSITIONS[current]:
                raise IllegalTransition(job_id, current, status)
            now = time.time()
            history.append({"status": status, "at": now, **({"reason": reason} if reason else {})})
            db.execute(
                "UPDATE jobs SET status = ?, updated_at = ?, history = ?, error = COALESCE(?, error) "
                "WHERE id = ?",
                (status, now, json.dumps(history), error, job_id),
            )
            self._event(
                db,
                job_id,
                "status",
                {
                    "status": status,
                    **({"reason": reason} if reason else {}),
                    **({"error": error} if error else {}),
                },
            )
        return self.get(job_id)

    # -- events --------------------------------------------------------------------------------------------
    def _event(self, db: sqlite3.Connection, job_id: str, kind: str, data: dict[str, Any]) -> None:
        db.execute(
            "INSERT INTO events (job_id, at, kind, data) VALUES (?, ?, ?, ?)",
            (job_id, time.time(), kind, json.dumps(finite(data), allow_nan=False)),
        )

    def add_event(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        """Append an event; a non-finite float anywhere in ``data`` is stored as null."""
        with self._tx(job_id) as db:
            self._event(db, job_id, kind, data)

    def last_event(self, job_id: str, kind: str) -> dict[str, Any] | None:
        """The newest event of ``kind`` (one indexed row, however long the job has run)."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, at, kind, data FROM events WHERE job_id = ? AND kind = ? "
                "ORDER BY seq DESC LIMIT 1",
                (job_id, kind),
            ).fetchone()
        return _row_event(row) if row else None

    def role_restarts(self, job_id: str | None = None, by: str = "role_kind") -> dict[str, int]:
        """Role replacements of job ``job_id`` (of every job ever run when None), by role kind
        (``worker``, ``memoryx``, ...; ``by="fault"``: by how the role was lost, ``died`` or ``hung``;
        events stored before that field count as ``died``), from the stored "restart" events: one grouped
        query over the partial index ``events_restart``, so it costs the number of restarts, not of events,
        and counts the same after a service restart."""
        if by not in ("role_kind", "fault"):
            raise ValueError(f"restarts are counted by role_kind or fault, not {by!r}")
        where, args = (
            ("kind = 'restart'", ()) if job_id is None else ("kind = 'restart' AND job_id = ?", (job_id,))
        )
        default = "'died'" if by == "fault" else "NULL"
        with self._lock:
            rows = self._db.execute(
                f"SELECT COALESCE(json_extract(data, '$.{by}'), {default}), COUNT(*) FROM events "
                f"WHERE {where} GROUP BY 1",
                args,
            ).fetchall()
        return {str(kind): n for kind, n in rows if kind is not None}

    def events(
        self, job_id: str, after: int = 0, kinds: tuple[str, ...] | None = None
    ) -> builtins.list[Event]:
        self.get(job_id)
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, at, kind, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq",
                (job_id, after),
            ).fetchall()
        out = [_row_event(r) for r in rows]
        return [e for e in out if kinds is None or e["kind"] in kinds]

    def tail(self, job_id: str, after: int = 0) -> tuple[bool, builtins.list[Event]]:
        """Whether the job has finished, and its events with seq > ``after``, read together (one lock):
        when it says finished, the events include every one up to the job's end (``notify.follow``)."""
        with self._lock:
            return self.get(job_id).status in TERMINAL, self.events(job_id, after)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±Infinity) in it, however deeply nested, as None:
    strict JSON has no such numbers, and a client's parser may reject the whole message for one."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def event_json(event: Event) -> str:
    """What both APIs send as an event's data: its data with its time ``at``, as strict JSON (the
    store's events hold no non-finite float; one that slipped in would raise here, not go out)."""
    return json.dumps({**event["data"], "at": event["at"]}, allow_nan=False)


def _row_event(row: tuple[Any, ...]) -> Event:
    # parse_constant: a row written before non-finite floats were nulled may hold NaN or Infinity
    data = json.loads(row[3], parse_constant=lambda _: None)
    return {"seq": row[0], "at": row[1], "kind": row[2], "data": data}


def _job(row: tuple[Any, ...]) -> Job:
    (job_id, status, params, num_csx, labels, priority, created, updated, error, model_dir, history, user) = (
        row
    )
    return Job(
        job_id,
        status,
        json.loads(params),
        num_csx,
        json.loads(labels),
        priority,
        created,
        updated,
        error,
        model_dir,
        json.loads(history),
        user,
    )

"""What a job records beyond its submission, without HTTP: who submitted it (the service's user name, in
stores written before that too), label and priority changes within the submission's limits, and the time
it has spent running."""

from __future__ import annotations

import getpass
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import Fleet
from weightstream.jobs import config as config_module
from weightstream.jobs.api.views import JobView
from weightstream.jobs.config import ServiceConfig, default_user_name
from weightstream.jobs.limits import MAX_LABEL_LENGTH, MAX_LABELS, apply_label_change
from weightstream.jobs.service import JobService
from weightstream.jobs.store import Job, JobFinished, JobStore, UnknownJob

# the jobs table as the service created it before it recorded who submitted a job
OLD_SCHEMA = """
CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, params TEXT NOT NULL, num_csx INTEGER NOT NULL,
    labels TEXT NOT NULL, priority INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    error TEXT, model_dir TEXT NOT NULL, history TEXT NOT NULL);
"""


def test_a_store_written_before_users_were_recorded_opens_and_keeps_its_jobs(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "jobs.sqlite")
    db.executescript(OLD_SCHEMA)
    history = json.dumps([{"status": "queued", "at": 1.0}])
    db.execute(
        "INSERT INTO jobs VALUES ('old', 'queued', '{}', 1, '{}', 2, 1.0, 1.0, NULL, '/x', ?)", (history,)
    )
    db.commit()
    db.close()
    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        assert store.get("old").user == "" and store.get("old").priority == 2
        assert store.create("new", {}, 1, {}, 2, tmp_path / "new", "carol").user == "carol"
        assert [j.id for j in store.queue()] == ["old", "new"]
    finally:
        store.close()
    reopened = JobStore(tmp_path / "jobs.sqlite")  # the added column is there now: no second ALTER
    assert reopened.get("new").user == "carol"
    reopened.close()


def test_the_user_name_is_one_printable_word_and_defaults_to_the_os_user(tmp_path: Path) -> None:
    assert ServiceConfig(tmp_path, slots=1).user_name == getpass.getuser()
    assert ServiceConfig(tmp_path, slots=1, user_name="dana@lab").user_name == "dana@lab"
    for bad in ("two words", "new\nline", "tab\t", "esc\x1b[31m", "x" * (MAX_LABEL_LENGTH + 1)):
        with pytest.raises(ValueError, match=r"serve --user-name"):
            ServiceConfig(tmp_path, slots=1, user_name=bad)


def test_a_uid_without_a_name_is_named_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_name() -> str:
        raise KeyError("getpwuid(): uid not found: 10001")

    monkeypatch.setattr(config_module.getpass, "getuser", no_name)
    monkeypatch.setattr(config_module.os, "getuid", lambda: 10001)
    assert default_user_name() == "uid-10001"


@pytest.mark.parametrize(
    ("set_", "remove", "merged", "problem"),
    [
        ({"b": "2"}, ["a"], {"b": "2"}, None),
        ({"a": "changed"}, [], {"a": "changed"}, None),
        ({}, ["not-there"], {"a": "1"}, None),
        ({"a": "x"}, ["a"], None, "remove: a key cannot be both set and removed"),
        ({"k" * (MAX_LABEL_LENGTH + 1): "v"}, [], None, f"keys must have 1 to {MAX_LABEL_LENGTH}"),
        ({"": "v"}, [], None, "keys must have 1 to"),
        ({"k": 1}, [], None, "keys and values must be strings"),
        ("k=v", [], None, "set: must be a mapping"),
        ({}, "a", None, "remove: must be a list of label keys"),
        ({f"k{i}": "v" for i in range(MAX_LABELS)}, [], None, f"it would have {MAX_LABELS + 1}"),
        ({f"k{i}": "v" for i in range(MAX_LABELS - 1)}, [], "ok", None),  # 32 with "a": the limit itself
    ],
)
def test_a_label_change_follows_the_submission_rules(
    set_: Any, remove: Any, merged: dict[str, str] | str | None, problem: str | None
) -> None:
    got, problems = apply_label_change({"a": "1"}, set_, remove)
    if problem is None:
        assert problems == []
        assert got == merged if isinstance(merged, dict) else len(got) == MAX_LABELS
    else:
        assert any(problem in str(p) for p in problems), [str(p) for p in problems]


def test_priority_changes_only_while_the_job_has_not_finished(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        store.create("j", {}, 1, {}, 2, tmp_path / "j")
        assert store.set_priority("j", 1).priority == 1
        store.transition("j", "running")
        assert store.set_priority("j", 3).priority == 3  # kept if a restart requeues it
        store.transition("j", "succeeded")
        with pytest.raises(JobFinished, match=r"job j has finished \(succeeded\): its priority"):
            store.set_priority("j", 1)
        assert store.get("j").priority == 3
        assert store.set_labels("j", {"after": "the end"}).labels == {"after": "the end"}
        for change in (lambda: store.set_priority("nope", 1), lambda: store.set_labels("nope", {})):
            with pytest.raises(UnknownJob):
                change()
    finally:
        store.close()


def test_duration_counts_the_run_under_way(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    try:
        store.create("j", {}, 1, {}, 2, tmp_path / "j")
        assert JobView.of(store.get("j")).duration_s == 0.0
        started = store.transition("j", "running").history[-1]["at"]
        time.sleep(0.05)
        view = JobView.of(store.get("j"))
        assert view.duration_s >= 0.05 and view.duration_s <= time.time() - started
        ended = store.transition("j", "succeeded").history[-1]["at"]
        time.sleep(0.02)
        assert JobView.of(store.get("j")).duration_s == pytest.approx(ended - started)  # stopped counting
    finally:
        store.close()


def test_label_changes_at_the_same_time_all_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each change reads the labels, merges and writes: two at once must not write over each other. The
    read is slowed down here so that, unserialised, every change would read the same old labels."""
    service = JobService(ServiceConfig(tmp_path, slots=1), runner_factory=Fleet())
    try:
        service.store.create("j", {}, 1, {"name": "j"}, 2, tmp_path / "j")  # straight in: never started
        read = service.store.get

        def slow_read(job_id: str) -> Job:
            job = read(job_id)
            time.sleep(0.02)
            return job

        monkeypatch.setattr(service.store, "get", slow_read)
        threads = [threading.Thread(target=service.set_labels, args=("j", {f"k{i}": "v"})) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert read("j").labels == {"name": "j", **{f"k{i}": "v" for i in range(8)}}
    finally:
        service.shutdown()

"""``GET /v1/jobs/{id}/logs/export``: a job's logs as one tar.gz, served for real on loopback.

A job's directory is written by its own training processes: a link, a FIFO or a directory planted there
must not make the service read (or hang on) anything but the job's own plain files. The archive is
bounded (each file keeps its end, the whole has a ceiling, what was cut is listed) and streamed in
chunks, not built in memory.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.jobs.live_api import LiveApi
from weightstream.jobs import log_export
from weightstream.jobs.log_export import CHUNK_BYTES, job_log_archive


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveApi]:
    with LiveApi(tmp_path / "data") as api:
        yield api


def _export(live: LiveApi, job_id: str) -> dict[str, bytes]:
    with live.http() as http:
        r = http.get(f"/v1/jobs/{job_id}/logs/export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/gzip"
    assert r.headers["content-disposition"] == f'attachment; filename="{job_id}-logs.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        members = tar.getmembers()
        assert all(m.isreg() and m.mode == 0o640 for m in members), [(m.name, m.type) for m in members]
        return {m.name.removeprefix(f"{job_id}/"): tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]


def test_only_the_jobs_own_plain_files_go_in(live: LiveApi, tmp_path: Path) -> None:
    job = live.finished_job()  # its runner wrote run.log and metrics.jsonl
    model_dir = Path(job.model_dir)
    secret = tmp_path / "secret.log"
    secret.write_text("the service's own secrets\n")
    (model_dir / "params.yaml").symlink_to(secret)  # a top file that is a link
    logs = model_dir / "logs"
    logs.mkdir()
    (logs / "worker-0.log").write_text("worker 0\n")
    (logs / "evil.log").symlink_to(secret)
    (logs / "loop.log").symlink_to(logs / "loop.log")
    os.mkfifo(logs / "pipe.log")  # opened blocking, it would hang the export forever
    (logs / "dir.log").mkdir()
    (logs / "worker-0.ready.json").write_text("{}")
    got = _export(live, job.id)
    assert got == {
        "run.log": b"step 1 loss 4.1\ncheckpoint 1 saved\n",
        "metrics.jsonl": (model_dir / "metrics.jsonl").read_bytes(),
        "logs/worker-0.log": b"worker 0\n",
    }


def test_a_logs_directory_that_is_a_link_is_not_followed(live: LiveApi, tmp_path: Path) -> None:
    job = live.finished_job()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "other-job.log").write_text("not this job's\n")
    (Path(job.model_dir) / "logs").symlink_to(elsewhere)
    assert set(_export(live, job.id)) == {"run.log", "metrics.jsonl"}


def test_gnu_tar_reads_the_archive(live: LiveApi, tmp_path: Path) -> None:
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("no tar program on this machine")
    job = live.finished_job()
    archive = tmp_path / "logs.tar.gz"
    with live.http() as http:
        archive.write_bytes(http.get(f"/v1/jobs/{job.id}/logs/export").content)
    r = subprocess.run([tar, "tzf", str(archive)], capture_output=True, text=True, check=False, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.split() == [f"{job.id}/run.log", f"{job.id}/metrics.jsonl"]


def test_the_archive_is_bounded_and_says_what_it_cut(live: LiveApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_export, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(log_export, "MAX_EXPORT_BYTES", 3000)
    monkeypatch.setattr(log_export, "MAX_MEMBERS", 5)
    job = live.finished_job()
    model_dir = Path(job.model_dir)
    run_log = b"".join(b"line %05d\n" % i for i in range(500))  # 5500 bytes
    (model_dir / "run.log").write_bytes(run_log)
    (model_dir / "params.yaml").write_bytes(b"p" * 900)
    metrics = (model_dir / "metrics.jsonl").read_bytes()  # a few dozen bytes
    (model_dir / "logs").mkdir()
    for name in ("a", "b", "c", "d"):
        (model_dir / "logs" / f"{name}.log").write_bytes(name.encode() * 800)
    got = _export(live, job.id)
    assert got["run.log"] == run_log[-1000:]  # its end: the newest lines
    assert got["params.yaml"] == b"p" * 900 and got["metrics.jsonl"] == metrics
    assert got["logs/a.log"] == b"a" * 800
    budget_left = 3000 - 1000 - 900 - len(metrics) - 800
    assert got["logs/b.log"] == b"b" * budget_left  # the rest of the budget, from its end
    assert "logs/c.log" not in got and "logs/d.log" not in got  # five files: MAX_MEMBERS
    note = got["TRUNCATED.txt"].decode()
    assert f"run.log: its last 1000 of {len(run_log)} bytes" in note
    assert f"logs/b.log: its last {budget_left} of 800 bytes" in note
    assert "2 more files left out, from logs/c.log on" in note


def test_a_file_past_the_budget_is_left_out_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_export, "MAX_EXPORT_BYTES", 10)
    (tmp_path / "run.log").write_bytes(b"0123456789")
    (tmp_path / "params.yaml").write_bytes(b"abcde")
    archive = io.BytesIO(b"".join(job_log_archive("j1", tmp_path)))
    with tarfile.open(fileobj=archive, mode="r:gz") as tar:
        assert tar.getnames() == ["j1/run.log", "j1/TRUNCATED.txt"]
        assert b"params.yaml: left out (5 bytes)" in tar.extractfile("j1/TRUNCATED.txt").read()  # type: ignore[union-attr]


def test_the_archive_streams_in_chunks(tmp_path: Path) -> None:
    """A log of several chunks comes out as several pieces (memory holds one), and reads back whole."""
    (tmp_path / "run.log").write_bytes(os.urandom(3 * CHUNK_BYTES + 17))  # random: gzip cannot shrink it
    pieces = list(job_log_archive("j1", tmp_path))
    assert len(pieces) >= 3 and max(map(len, pieces)) < 2 * CHUNK_BYTES
    with tarfile.open(fileobj=io.BytesIO(b"".join(pieces)), mode="r:gz") as tar:
        assert tar.extractfile("j1/run.log").read() == (tmp_path / "run.log").read_bytes()  # type: ignore[union-attr]


def test_a_file_that_shrinks_while_it_is_read_keeps_the_archive_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header promises the size read when the file was opened; a log cut shorter since (rotated,
    truncated) is filled with zeros to that size, so the members after it are still where tar looks."""
    (tmp_path / "run.log").write_bytes(b"short")
    (tmp_path / "params.yaml").write_bytes(b"next member")
    real_fstat = os.fstat

    def longer(fd: int) -> os.stat_result:  # run.log "was" 100 bytes longer when its size was read
        st = real_fstat(fd)
        if st.st_size != 5:
            return st
        fields = list(st)
        fields[6] += 100  # st_size
        return os.stat_result(fields)

    monkeypatch.setattr(log_export.os, "fstat", longer)
    with tarfile.open(fileobj=io.BytesIO(b"".join(job_log_archive("j1", tmp_path))), mode="r:gz") as tar:
        assert tar.extractfile("j1/run.log").read() == b"short" + b"\0" * 100  # type: ignore[union-attr]
        assert tar.extractfile("j1/params.yaml").read() == b"next member"  # type: ignore[union-attr]


def test_a_missing_directory_gives_an_empty_archive(tmp_path: Path) -> None:
    with tarfile.open(
        fileobj=io.BytesIO(b"".join(job_log_archive("j1", tmp_path / "none"))), mode="r:gz"
    ) as t:
        assert t.getmembers() == []

"""The client at the edge: it downloads only plain file names a server lists (a hostile server on
loopback offers others), quotes names on the way, and `wsctl submit` reports a malformed YAML file on one
line, naming the file and the line."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from fastapi.responses import Response

from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import CHECKPOINT_FILES, TOKEN, LiveApi, ThreadedServer
from weightstream_client import ApiError, CheckpointExistsError, Client
from weightstream_client._client import load_params


class HostileServer:
    """Answers like a weightstream service, but lists whatever checkpoint it is told to; records every
    file it is asked for."""

    def __init__(self) -> None:
        self.checkpoint: dict[str, Any] = {}
        self.requested: list[str] = []
        app = FastAPI()

        @app.get("/v1/jobs/{job_id}")
        def job(job_id: str) -> dict[str, Any]:
            return {"id": job_id, "status": "succeeded"}

        @app.get("/v1/jobs/{job_id}/checkpoints")
        def checkpoints(job_id: str) -> dict[str, Any]:
            return {"checkpoints": [self.checkpoint]}

        @app.get("/v1/jobs/{job_id}/checkpoints/{step}/files/{name:path}")
        def file(job_id: str, step: str, name: str) -> Response:
            self.requested.append(name)
            if name == "gone.safetensors":  # deleted between the listing and the download
                error = b'{"error": {"code": "not_found", "message": "gone.safetensors is gone"}}'
                return Response(error, status_code=404, media_type="application/json")
            return Response(b"pwned", media_type="application/octet-stream")

        self.app = app


@pytest.fixture
def hostile() -> Iterator[tuple[HostileServer, Client]]:
    server = HostileServer()
    with ThreadedServer(server.app) as served, Client(served.url, TOKEN) as client:
        yield server, client


# parent, nested, absolute, subdirectory, Windows separator, dot names, empty, drive, NUL, not a string
UNSAFE = ["../escape.txt", "../../x", "/tmp/abs.txt", "sub/file", "a\\b", "..", ".", "", "C:evil", "n\x00", 7]


@pytest.mark.parametrize("name", UNSAFE, ids=repr)
def test_download_refuses_a_name_that_is_not_a_plain_file_name(
    hostile: tuple[HostileServer, Client], tmp_path: Path, name: Any
) -> None:
    server, client = hostile
    # a good file first: nothing at all may be written before the listing is found unsafe
    files = [{"name": "model.safetensors", "size": 5}, {"name": name, "size": 5}]
    server.checkpoint = {"step": 1, "files": files}
    out = tmp_path / "out" / "deeper"
    with pytest.raises(ApiError) as e:
        client.job("j1").download(out)
    assert e.value.code == "unsafe_name" and repr(name) in e.value.message
    assert list(tmp_path.rglob("*")) == [] and server.requested == []


@pytest.mark.parametrize("step", ["../..", -1, 1.5, True, None])
def test_download_refuses_a_malformed_step(
    hostile: tuple[HostileServer, Client], tmp_path: Path, step: Any
) -> None:
    server, client = hostile
    server.checkpoint = {"step": step, "files": [{"name": "model.safetensors", "size": 5}]}
    with pytest.raises(ApiError) as e:
        client.job("j1").download(tmp_path)
    assert e.value.code == "bad_listing" and repr(step) in e.value.message
    assert list(tmp_path.iterdir()) == [] and server.requested == []


@pytest.mark.parametrize(
    ("listed", "code"),
    [
        ({"name": "model.safetensors", "size": 9}, "incomplete"),
        ({"name": "gone.safetensors", "size": 5}, "not_found"),
    ],
)
def test_a_failed_file_download_leaves_nothing_behind_and_an_earlier_file_whole(
    hostile: tuple[HostileServer, Client], tmp_path: Path, listed: dict[str, Any], code: str
) -> None:
    """A short file (the server sent 5 of the 9 bytes it listed) or the service's error answer: the
    ApiError says which, no temporary file is left, and a file of an earlier download stays as it was."""
    server, client = hostile
    server.checkpoint = {"step": 1, "files": [listed]}
    earlier = tmp_path / "checkpoint_1" / listed["name"]
    earlier.parent.mkdir()
    earlier.write_bytes(b"earlier")
    with pytest.raises(ApiError) as e:
        client.job("j1").download(tmp_path, overwrite=True)
    assert e.value.code == code and listed["name"] in e.value.message
    assert list(earlier.parent.iterdir()) == [earlier] and earlier.read_bytes() == b"earlier"
    assert list(tmp_path.iterdir()) == [earlier.parent]  # no staging directory left beside it


def test_download_of_a_real_checkpoint_writes_every_file(tmp_path: Path) -> None:
    with LiveApi(tmp_path / "data") as live, Client(live.url, TOKEN) as client:
        job = live.finished_job()
        path = client.job(job.id).download(tmp_path / "out")
    assert path == tmp_path / "out" / "checkpoint_1"
    assert {p.name: p.read_bytes() for p in path.iterdir()} == CHECKPOINT_FILES  # "notes #1.txt" too


STALE = {  # a single-file checkpoint left where a sharded one goes: loaded before the sharded index
    "model.safetensors.index.json": b"{}",
    "model-00001-of-00002.safetensors": b"old",
    "optimizer.safetensors": b"old",
    "config.json": b"{}",
}


def test_download_refuses_a_checkpoint_dir_with_files_unless_overwrite(tmp_path: Path) -> None:
    """A non-empty checkpoint_<step>/ is refused before anything is fetched, naming it; overwrite replaces
    the checkpoint's files as a set (the new ones in, old checkpoint files the new one lacks out) and
    keeps a file of the user's. An empty one is simply filled."""
    target = tmp_path / "out" / "checkpoint_1"
    target.mkdir(parents=True)
    for name, data in STALE.items():
        (target / name).write_bytes(data)
    (target / "NOTES.md").write_bytes(b"mine")
    with LiveApi(tmp_path / "data") as live, Client(live.url, TOKEN) as client:
        job = client.job(live.finished_job().id)
        with pytest.raises(CheckpointExistsError, match=rf"^{target} already exists and is not empty") as e:
            job.download(tmp_path / "out")
        assert e.value.path == target and "overwrite=True" in str(e.value)
        assert sorted(p.name for p in target.iterdir()) == sorted([*STALE, "NOTES.md"])  # untouched
        r = _wsctl(live.url, "download", job.id, str(tmp_path / "out"))
        assert r.returncode == 2 and r.stdout == "", r.stdout
        said = " ".join(r.stderr.split())
        assert f"{target} already exists and is not empty" in said and "--overwrite" in said, r.stderr

        assert job.download(tmp_path / "out", overwrite=True) == target
        assert {p.name: p.read_bytes() for p in target.iterdir()} == {**CHECKPOINT_FILES, "NOTES.md": b"mine"}
        assert list(target.parent.iterdir()) == [target]  # no staging directory left
        (tmp_path / "empty" / "checkpoint_1").mkdir(parents=True)
        r = _wsctl(live.url, "download", job.id, str(tmp_path / "empty"))
        assert r.returncode == 0, r.stderr
        assert {p.name for p in (tmp_path / "empty" / "checkpoint_1").iterdir()} == set(CHECKPOINT_FILES)


def test_wsctl_says_each_problem_of_a_refused_submission_once(tmp_path: Path) -> None:
    """The service's 422 lists every problem in its message and again in its details: wsctl prints each
    once, with the value, under one headline."""
    params = copy.deepcopy(TINY)
    params["train_input"]["batch_size"] = 0
    params["runconfig"]["max_steps"] = -1
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with LiveApi(tmp_path / "data") as live:
        r = _wsctl(live.url, "submit", str(path))
    assert r.returncode == 2 and r.stdout == "", r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "error: invalid params (2 problems) [invalid_params, HTTP 422]:", r.stderr
    assert len(lines) == 3 and all(line.startswith("  - ") for line in lines[1:]), r.stderr
    assert sum("train_input.batch_size" in line for line in lines) == 1, r.stderr
    assert sum("runconfig.max_steps" in line for line in lines) == 1, r.stderr


def _wsctl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    wsctl = [shutil.which("wsctl") or sys.executable]
    wsctl += [] if shutil.which("wsctl") else ["-c", "from weightstream_client.cli import main; main()"]
    env = {**os.environ, "WEIGHTSTREAM_URL": url, "WEIGHTSTREAM_TOKEN": TOKEN, "COLUMNS": "80"}
    return subprocess.run([*wsctl, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


BAD_YAML = "train_input:\n  batch_size: 8\nmodel: [1, 2\nrunconfig: {}\n"


def test_wsctl_submit_reports_malformed_yaml_on_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text(BAD_YAML)
    wsctl = [shutil.which("wsctl") or sys.executable]
    wsctl += [] if shutil.which("wsctl") else ["-c", "from weightstream_client.cli import main; main()"]
    # the URL is never contacted: the file is read first
    env = {**os.environ, "WEIGHTSTREAM_URL": "http://127.0.0.1:9", "WEIGHTSTREAM_TOKEN": TOKEN}
    r = subprocess.run(
        [*wsctl, "submit", str(bad)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "line 4" in lines[0], r.stderr


def test_load_params_names_the_file_and_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text(BAD_YAML)
    with pytest.raises(ValueError, match=rf"^{bad}, line 4, column \d+: not valid YAML: "):
        load_params(bad)
    with pytest.raises(ValueError, match=r"^the params text, line 4, column \d+: not valid YAML"):
        load_params(BAD_YAML)
    # YAML text with a line longer than any file name is text, not an unreadable path
    assert load_params("key: " + "x" * 400) == {"key": "x" * 400}

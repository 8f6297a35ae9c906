"""The REST edge on a real server: the token is checked before a byte of the body is read, bodies are
counted as they stream (413 past the limit, chunked too), NaN is a 422 naming the field, and checkpoint
downloads never follow a symlink out of the checkpoint.

The body tests speak HTTP/1.1 over a plain socket, so they know exactly how much of a body they had sent
when the answer came, and read the server's own peak memory from /proc.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import CHECKPOINT_FILES, TOKEN, LiveApi, ServeProcess
from weightstream.jobs.api import MAX_BODY_BYTES

AUTH = {"Authorization": f"Bearer {TOKEN}"}
BIG = 8 << 20  # the body of the finding: 8 MB, far over the limit
CHUNK = 64 << 10


def json_body(total: int) -> Iterator[bytes]:
    """Exactly ``total`` bytes of one valid JSON submit body (a long list in params), in CHUNK-sized
    pieces made as they are sent: the test process never holds the body."""
    head, tail = b'{"num_csx": 1, "params": {"filler": [0.5', b"]}}"
    items, pad = divmod(total - len(head) - len(tail), 4)
    yield head + b" " * pad
    while items > 0:
        n = min(items, CHUNK // 4)
        yield b",0.5" * n
        items -= n
    yield tail


@dataclass
class Outcome:
    status: int
    headers: http.client.HTTPMessage
    body: dict[str, Any]
    sent_before_answer: int  # body bytes the client had sent when the answer was there to read
    closed: bool  # the server dropped the connection after answering, leaving the rest of the body unread


def exchange(
    port: int,
    headers: dict[str, str],
    chunks: Iterator[bytes],
    chunked: bool = True,
    wait_for_early_answer_s: float = 0.0,
    pace_s: float = 0.01,
) -> Outcome:
    """POST /v1/jobs with the body from ``chunks``, looking for an answer before each chunk: first for up
    to ``wait_for_early_answer_s`` (a server that refuses from the headers answers then), then for
    ``pace_s`` after each chunk, which keeps the client close to what the server has read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    with sock:
        head = ["POST /v1/jobs HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head += ["Transfer-Encoding: chunked"] if chunked else []
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent, answered = 0, _readable(sock, wait_for_early_answer_s)
        for chunk in [] if answered else chunks:
            try:
                sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server has answered and closed: read what it said
            sent += len(chunk)
            if _readable(sock, pace_s):
                break
        else:
            if chunked and not answered:
                sock.sendall(b"0\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = json.loads(response.read())
        return Outcome(response.status, response.headers, body, sent, _dropped(sock, chunked))


def _dropped(sock: socket.socket, chunked: bool) -> bool:
    """Whether the server has dropped the connection: going on with the body fails well before another
    64 MiB are through (a server that reads on to throw the rest away takes them all in a second)."""
    piece = b",0.5" * (CHUNK // 4)
    sock.settimeout(10)  # a server neither reading nor closing: not dropped
    try:
        for _ in range((64 << 20) // CHUNK):
            sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
    except (BrokenPipeError, ConnectionResetError):
        return True
    except TimeoutError:
        return False
    return False


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    return bool(select.select([sock], [], [], timeout_s)[0])


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def reset_peak_rss(pid: int) -> None:
    """Start the peak over from the current RSS (Linux: '5' into clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the server's memory from /proc (Linux)")
    tmp = tmp_path_factory.mktemp("serve")
    server = ServeProcess(tmp / "data", tmp / "serve.log")
    yield server
    server.stop()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveApi]:
    with LiveApi(tmp_path / "data") as api:
        yield api


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_unauthenticated_body_is_refused_before_a_byte_is_read(served: ServeProcess, chunked: bool) -> None:
    headers = {} if chunked else {"Content-Length": str(BIG)}
    warm = exchange(served.port, headers, json_body(BIG), chunked, wait_for_early_answer_s=10)
    assert warm.status == 401  # the first answer also loads what answering needs: not counted below
    reset_peak_rss(served.pid)
    before = peak_rss(served.pid)
    # a generous wait for the early answer: a server that reads the body first stays silent through it
    out = exchange(served.port, headers, json_body(BIG), chunked, wait_for_early_answer_s=10)
    grown = peak_rss(served.pid) - before
    assert out.status == 401 and out.body["error"]["code"] == "unauthorized", out.body
    assert out.headers["WWW-Authenticate"] == "Bearer"
    assert grown < 4 << 20, f"the server's peak memory grew by {grown / 2**20:.1f} MiB"
    assert out.sent_before_answer == 0, "the server waited for the body before refusing"
    assert out.closed, "the server kept the connection open to read the rest of the body"


def test_authenticated_chunked_body_over_the_limit_is_cut_off(served: ServeProcess) -> None:
    total = 4 * BIG  # room for a slow server to lag behind the client by seconds
    out = exchange(served.port, AUTH, json_body(total), chunked=True)
    assert out.status == 413, out.body
    assert out.body["error"]["code"] == "too_large"
    assert str(MAX_BODY_BYTES) in out.body["error"]["message"]
    assert MAX_BODY_BYTES < out.sent_before_answer < total, "answered only after the whole body"
    assert out.closed, "the server kept the connection open to read the rest of the body"


def test_declared_length_over_the_limit_is_refused_before_the_body(served: ServeProcess) -> None:
    headers = {**AUTH, "Content-Length": str(MAX_BODY_BYTES + 1)}
    out = exchange(served.port, headers, json_body(MAX_BODY_BYTES + 1), False, wait_for_early_answer_s=10)
    assert out.status == 413 and out.body["error"]["code"] == "too_large"
    assert out.sent_before_answer == 0 and out.closed


def test_a_chunked_body_within_the_limit_reaches_the_route(served: ServeProcess) -> None:
    text = json.dumps({"params": {**TINY, "sparsity": {}}, "num_csx": 1}).encode()
    pieces = iter([text[i : i + 100] for i in range(0, len(text), 100)])
    out = exchange(served.port, AUTH, pieces, chunked=True, pace_s=0)
    # parsed whole, params validation ran: the unknown section is named
    assert out.status == 422 and out.body["error"]["code"] == "invalid_params", out.body
    assert out.body["error"]["details"][0]["path"] == "sparsity.sparsity"  # the level is required


@pytest.mark.parametrize(
    ("where", "literal"),
    [
        ("params.optimizer.weight_decay", "NaN"),
        ("params.optimizer.betas.1", "Infinity"),
        ("params.runconfig.rpc_timeout_s", "-Infinity"),
        ("params.anything", "NaN"),
        ("priority", "NaN"),
    ],
)
def test_non_finite_numbers_are_a_422_naming_the_field(live: LiveApi, where: str, literal: str) -> None:
    body: dict[str, Any] = {"params": json.loads(json.dumps(TINY)), "num_csx": 1}
    *parents, last = where.split(".")
    node: Any = body
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = "__here__"
    text = json.dumps(body).replace('"__here__"', literal)
    with live.http() as http:
        r = http.post("/v1/jobs", content=text, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["details"] == [
            {"path": f"body.{where}", "message": "must be a finite number (JSON has no NaN or Infinity)"}
        ]
        assert http.get("/v1/jobs").json()["jobs"] == []  # nothing was queued


def test_open_routes_stay_open_and_every_v1_path_needs_the_token(live: LiveApi) -> None:
    for path in ("/healthz", "/metrics", "/openapi.json", "/docs"):
        assert httpx.get(live.url + path).status_code == 200, path
    for path in ("/v1/jobs", "/v1/jobs/x/checkpoints", "/v1/no-such-route", "/v1"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            r = httpx.get(live.url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json() == {"error": {"code": "unauthorized", "message": r.json()["error"]["message"]}}
            assert r.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.get(live.url + "/v1/jobs", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_checkpoint_files_are_served_only_from_inside_the_checkpoint(live: LiveApi, tmp_path: Path) -> None:
    job = live.finished_job()
    model_dir = Path(job.model_dir)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the API")
    cp = model_dir / "checkpoint_1"
    (cp / "leak.txt").symlink_to(secret)
    (cp / "alias.safetensors").symlink_to(cp / "model.safetensors")  # inside, but a link all the same
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "trainer_state.json").write_text("{}")
    (model_dir / "checkpoint_2").symlink_to(elsewhere, target_is_directory=True)

    def file_url(step: int, name: str) -> str:
        return f"/v1/jobs/{job.id}/checkpoints/{step}/files/{quote(name, safe='')}"

    with live.http() as http:
        listed = http.get(f"/v1/jobs/{job.id}/checkpoints").json()["checkpoints"]
        assert [c["step"] for c in listed] == [1]
        assert sorted(f["name"] for f in listed[0]["files"]) == sorted(CHECKPOINT_FILES)
        for name, data in CHECKPOINT_FILES.items():
            assert http.get(file_url(1, name)).content == data
        for step, name in ((1, "leak.txt"), (1, "alias.safetensors"), (2, "trainer_state.json"), (1, "no")):
            r = http.get(file_url(step, name))
            assert r.status_code == 404, (step, name)
            message = f"job {job.id} has no checkpoint file {name!r} at step {step}"
            assert r.json() == {"error": {"code": "not_found", "message": message}}


def test_a_checkpoint_file_deleted_by_retention_after_its_check_still_downloads_whole(
    live: LiveApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention may delete an old checkpoint between the route's checks and the download: the file is
    opened by the check itself, so the download is whole, never a 500."""
    job = live.finished_job()
    service = live.service
    checked = service.open_checkpoint_file

    def then_deleted(job_id: str, step: int, name: str) -> Any:
        f = checked(job_id, step, name)
        # as prune_checkpoints would, right after the check
        (Path(job.model_dir) / f"checkpoint_{step}" / name).unlink()
        return f

    monkeypatch.setattr(service, "open_checkpoint_file", then_deleted)
    name, data = next(iter(CHECKPOINT_FILES.items()))
    with live.http() as http:
        r = http.get(f"/v1/jobs/{job.id}/checkpoints/1/files/{quote(name, safe='')}")
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-length"] == str(len(data))


def test_an_event_cursor_beyond_sqlites_integers_is_a_422_not_a_broken_stream(live: LiveApi) -> None:
    """Found by the slow schemathesis run: ``after=2**63`` overflowed SQLite inside the stream, which then
    broke off mid-response."""
    job = live.finished_job()
    with live.http() as http:
        r = http.get(f"/v1/jobs/{job.id}/events", params={"after": 2**63, "follow": "false"})
        assert r.status_code == 422 and "after" in r.text
        r = http.get(f"/v1/jobs/{job.id}/events", params={"after": 2**63 - 1, "follow": "false"})
        assert r.status_code == 200 and r.text == ""


def test_a_checkpoint_without_its_trainer_state_is_neither_listed_nor_served(live: LiveApi) -> None:
    """``trainer_state.json`` is written last: a directory without it is not a checkpoint yet."""
    job = live.finished_job()
    unfinished = Path(job.model_dir) / "checkpoint_3"
    unfinished.mkdir()
    (unfinished / "model.safetensors").write_bytes(b"half")
    with live.http() as http:
        listed = http.get(f"/v1/jobs/{job.id}/checkpoints").json()["checkpoints"]
        assert [c["step"] for c in listed] == [1]
        r = http.get(f"/v1/jobs/{job.id}/checkpoints/3/files/model.safetensors")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

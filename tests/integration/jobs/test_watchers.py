"""Many followers of running jobs, over the real REST server (uvicorn) and the real aio gRPC server on
loopback, in front of a real JobService whose runners are fakes that block until the test releases them.

What the service is sized for: 200 ``WatchJob`` streams and 200 server-sent-event followers cost no
thread each, and while they are open ``/healthz`` and a job submission over either API answer within a
second; an event reaches every follower, and the job's end ends every stream. Event data is strict JSON
over both APIs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
import uvicorn

from tests.fleet import Fleet
from tests.integration.appliance import TINY, weightstream_cmd
from tests.waiting import wait_until, wait_until_async
from weightstream.jobs.api import create_app
from weightstream.jobs.grpc_api import serve_grpc
from weightstream.jobs.service import JobService, QueueFull, ServiceConfig
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc

TOKEN = "watchers-token-0123456789"
REST_AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)
WATCHERS = 200  # per API: the number of followers the service is sized for
RESPONSIVE_S = 1.0  # the bound on /healthz and a submission while they are open


def _strict(text: str) -> dict[str, Any]:
    """json.loads that refuses NaN and ±Infinity, as a strict JSON parser (JavaScript's) does."""

    def reject(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    data: dict[str, Any] = json.loads(text, parse_constant=reject)
    return data


class Coordinator:
    """A JobService with fake runners, its REST app under uvicorn and its gRPC API, all in this process
    on loopback ports (the fakes must be reachable from the test; the servers are the real ones)."""

    def __init__(self, data_dir: Path, slots: int = 2, service: JobService | None = None) -> None:
        self.fleet = Fleet()
        self.service = service or JobService(
            ServiceConfig(data_dir=data_dir, slots=slots), runner_factory=self.fleet
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # bound here and handed over: no race for a free port
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(self.service, TOKEN),
            log_level="warning",
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
        )
        self.rest = uvicorn.Server(config)
        self._rest_thread = threading.Thread(target=self.rest.run, kwargs={"sockets": [sock]}, daemon=True)
        self._rest_thread.start()
        self.grpc, port = serve_grpc(self.service, TOKEN, "127.0.0.1:0")
        self.grpc_address = f"127.0.0.1:{port}"
        wait_until(lambda: self.rest.started, lambda: "uvicorn to start", timeout=20)

    def submit(self, name: str) -> str:
        return self.service.submit(copy.deepcopy(TINY), 1, {"name": name}).id

    def stop(self) -> None:
        self.grpc.stop(grace=0)
        self.rest.should_exit = True
        self._rest_thread.join(timeout=20)
        self.service.shutdown()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = Coordinator(tmp_path / "data")
    try:
        yield c
    finally:
        c.stop()


class Watcher:
    """One follower of a job over REST (server-sent events) or gRPC (WatchJob); ``events`` as dicts
    ``{"seq", "kind", **data}`` with data parsed strictly."""

    def __init__(self, api: str, job_id: str) -> None:
        self.api, self.job_id = api, job_id
        self.events: list[dict[str, Any]] = []
        self.ended = False

    def saw(self, kind: str, **fields: Any) -> bool:
        return any(e["kind"] == kind and all(e.get(k) == v for k, v in fields.items()) for e in self.events)

    async def watch_sse(self, http: httpx.AsyncClient) -> None:
        async with http.stream("GET", f"/v1/jobs/{self.job_id}/events", headers=REST_AUTH) as r:
            assert r.status_code == 200, await r.aread()
            event: dict[str, Any] = {}
            async for line in r.aiter_lines():
                if line.startswith("id: "):
                    event["seq"] = int(line[4:])
                elif line.startswith("event: "):
                    event["kind"] = line[7:]
                elif line.startswith("data: "):
                    event.update(_strict(line[6:]))
                elif not line and event:
                    self.events.append(event)
                    event = {}
        self.ended = True

    async def watch_grpc(self, stub: rpc.CoordinatorStub) -> None:
        async for e in stub.WatchJob(pb.WatchJobRequest(job_id=self.job_id), metadata=GRPC_AUTH):
            self.events.append({"seq": e.seq, "kind": e.kind, **_strict(e.data_json)})
        self.ended = True


async def _timed_health(url: str) -> float:
    async with httpx.AsyncClient(base_url=url) as fresh:  # a new connection, as a probe makes
        start = time.monotonic()
        r = await fresh.get("/healthz", timeout=30)
        took = time.monotonic() - start
    assert r.status_code == 200
    return took


async def _timed_rest_submit(url: str, name: str) -> float:
    body = {"params": TINY, "num_csx": 1, "labels": {"name": name}}
    async with httpx.AsyncClient(base_url=url, headers=REST_AUTH) as fresh:
        start = time.monotonic()
        r = await fresh.post("/v1/jobs", json=body, timeout=30)
        took = time.monotonic() - start
    assert r.status_code == 201, r.text
    return took


async def _timed_grpc_submit(address: str, name: str) -> float:
    async with grpc.aio.insecure_channel(address) as fresh:  # connecting is part of what is timed
        request = pb.SubmitJobRequest(params_json=json.dumps(TINY), num_csx=1, labels={"name": name})
        start = time.monotonic()
        reply = await rpc.CoordinatorStub(fresh).SubmitJob(request, metadata=GRPC_AUTH, timeout=30)
        took = time.monotonic() - start
    assert json.loads(reply.job_json)["labels"] == {"name": name}
    return took


def test_200_watchers_per_api_cost_no_thread_each_and_leave_the_service_responsive(
    coordinator: Coordinator,
) -> None:
    c, store = coordinator, coordinator.service.store
    jobs = [c.submit("a"), c.submit("b")]
    wait_until(lambda: c.fleet.started == ["a", "b"], lambda: f"a and b to start ({c.fleet.started})")
    submitted = [f"{api}-{i}" for api in ("rest", "grpc") for i in range(4)]
    c.fleet.instant.update(submitted)  # they queue behind a and b, then finish when they start

    async def scenario() -> None:
        # warm up: the first request of each kind pays for imports, thread pools and connections
        await _timed_health(c.url)
        await _timed_rest_submit(c.url, "rest-0")
        await _timed_grpc_submit(c.grpc_address, "grpc-0")
        threads_before = threading.active_count()

        watchers = [Watcher(api, jobs[i % 2]) for api in ("rest", "grpc") for i in range(WATCHERS)]
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with (
            httpx.AsyncClient(base_url=c.url, limits=limits, timeout=60) as http,
            grpc.aio.insecure_channel(c.grpc_address) as channel,
        ):
            stub = rpc.CoordinatorStub(channel)
            tasks = [
                asyncio.create_task(w.watch_sse(http) if w.api == "rest" else w.watch_grpc(stub))
                for w in watchers
            ]
            try:
                await wait_until_async(
                    lambda: (
                        all(w.saw("status", status="running") for w in watchers)
                        or any(t.done() for t in tasks)
                    ),
                    "every watcher to catch up",
                    timeout=60,
                )
                caught_up = {
                    api: sum(w.saw("status", status="running") for w in watchers if w.api == api)
                    for api in ("rest", "grpc")
                }
                assert not any(t.done() for t in tasks), f"streams ended early; caught up: {caught_up}"
                # every stream is a future parked on the store's feed, none a thread
                await wait_until_async(
                    lambda: store.feed.waiting() == 2 * WATCHERS, "every stream to park", timeout=60
                )
                assert threading.active_count() - threads_before < WATCHERS // 2

                for i in range(1, 4):  # each request on a fresh connection, each within the bound
                    took = {
                        "healthz": await _timed_health(c.url),
                        "REST submit": await _timed_rest_submit(c.url, f"rest-{i}"),
                        "gRPC submit": await _timed_grpc_submit(c.grpc_address, f"grpc-{i}"),
                    }
                    slow = {k: round(v, 3) for k, v in took.items() if v >= RESPONSIVE_S}
                    assert not slow, f"with {2 * WATCHERS} streams open: {slow} s"

                # one event per job reaches every watcher of it; its NaN and Infinity arrive as null
                await asyncio.to_thread(store.add_event, jobs[0], "step", {"step": 1, "loss": math.nan})
                await asyncio.to_thread(store.add_event, jobs[1], "step", {"step": 1, "loss": math.inf})
                await wait_until_async(
                    lambda: all(w.saw("step", step=1) for w in watchers), "the step event", timeout=60
                )
                assert all(w.saw("step", step=1, loss=None) for w in watchers)

                # the jobs' end ends every stream, each with the final status as its last event
                for name in ("a", "b"):
                    c.fleet.runners[name].finish()
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
            finally:
                for t in tasks:
                    t.cancel()
        assert all(w.ended and w.events[-1] == {**w.events[-1], "status": "succeeded"} for w in watchers)
        await wait_until_async(
            lambda: store.feed.waiting() == 0, "every waiter to leave the feed", timeout=60
        )

    asyncio.run(scenario())
    for name in submitted:  # the submissions made while the streams were open were real jobs
        wait_until(partial(lambda n: c.fleet.runners.get(n) is not None, name), f"{name} to start")


def test_event_data_is_strict_json_over_both_apis(coordinator: Coordinator, tmp_path: Path) -> None:
    """Non-finite floats added now are stored as null, and one in a row written before that rule (raw
    ``NaN`` in SQLite) is read as null: neither API sends a token a strict JSON parser rejects."""
    c, store = coordinator, coordinator.service.store
    job = c.submit("n")
    wait_until(lambda: c.fleet.started == ["n"], lambda: "n to start")
    store.add_event(job, "step", {"step": 1, "loss": math.nan, "grads": [math.inf, -math.inf, 2.5]})
    with sqlite3.connect(store.path) as legacy:  # as an older version of the store wrote it
        legacy.execute(
            "INSERT INTO events (job_id, at, kind, data) VALUES (?, ?, 'eval', ?)",
            (job, time.time(), '{"eval_loss": NaN, "nested": {"x": [Infinity, -Infinity]}}'),
        )
    c.fleet.runners["n"].finish()
    wait_until(lambda: store.get(job).status == "succeeded", lambda: "n to succeed")

    sse = httpx.get(f"{c.url}/v1/jobs/{job}/events", params={"follow": False}, headers=REST_AUTH)
    rest_data = [_strict(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    with grpc.insecure_channel(c.grpc_address) as channel:
        stream = rpc.CoordinatorStub(channel).WatchJob(
            pb.WatchJobRequest(job_id=job), metadata=GRPC_AUTH, timeout=30
        )
        grpc_data = [_strict(e.data_json) for e in stream]
    with sqlite3.connect(store.path) as db:  # the store wrote null, not NaN
        stored = db.execute("SELECT data FROM events WHERE job_id = ? AND kind = 'step'", (job,)).fetchone()
    assert _strict(stored[0]) == {"step": 1, "loss": None, "grads": [None, None, 2.5]}
    for data in (rest_data, grpc_data):
        step = next(d for d in data if "step" in d)
        assert step["loss"] is None and step["grads"] == [None, None, 2.5]
        legacy_eval = next(d for d in data if "eval_loss" in d)
        assert legacy_eval == {**legacy_eval, "eval_loss": None, "nested": {"x": [None, None]}}
        assert data[-1]["status"] == "succeeded"


def test_a_follower_that_goes_away_leaves_nothing_waiting(coordinator: Coordinator) -> None:
    """A cancelled WatchJob and a closed event stream each take their waiter off the feed."""
    c, store = coordinator, coordinator.service.store
    job = c.submit("q")
    wait_until(lambda: c.fleet.started == ["q"], lambda: "q to start")

    async def scenario() -> None:
        async with (
            httpx.AsyncClient(base_url=c.url, headers=REST_AUTH, timeout=30) as http,
            grpc.aio.insecure_channel(c.grpc_address) as channel,
        ):
            call = rpc.CoordinatorStub(channel).WatchJob(pb.WatchJobRequest(job_id=job), metadata=GRPC_AUTH)
            async with http.stream("GET", f"/v1/jobs/{job}/events") as r:
                assert r.status_code == 200
                await wait_until_async(
                    lambda: store.feed.waiting() == 2, "both followers to park", timeout=20
                )
            call.cancel()
            await wait_until_async(lambda: store.feed.waiting() == 0, "both waiters to leave", timeout=20)

    asyncio.run(scenario())
    c.fleet.runners["q"].finish()


def test_grpc_maps_a_full_queue_and_bad_json(tmp_path: Path) -> None:
    """SubmitJob stays a translation: the service's QueueFull is RESOURCE_EXHAUSTED, params_json that is
    not a JSON object is INVALID_ARGUMENT naming the field."""

    class FullService(JobService):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise QueueFull("64 jobs are queued already; try again later")

    c = Coordinator(tmp_path / "data", service=FullService(ServiceConfig(data_dir=tmp_path / "d", slots=1)))
    try:
        with grpc.insecure_channel(c.grpc_address) as channel:
            stub = rpc.CoordinatorStub(channel)
            for params_json, code, says in (
                (json.dumps(TINY), grpc.StatusCode.RESOURCE_EXHAUSTED, "try again later"),
                ("{not json", grpc.StatusCode.INVALID_ARGUMENT, "params_json is not JSON"),
                ("[1, 2]", grpc.StatusCode.INVALID_ARGUMENT, "params_json must be a JSON object"),
            ):
                with pytest.raises(grpc.RpcError) as e:
                    stub.SubmitJob(
                        pb.SubmitJobRequest(params_json=params_json, num_csx=1),
                        metadata=GRPC_AUTH,
                        timeout=10,
                    )
                assert e.value.code() == code and says in (e.value.details() or "")
    finally:
        c.stop()


def test_serve_refuses_a_grpc_port_it_cannot_bind(coordinator: Coordinator, tmp_path: Path) -> None:
    """serve_grpc raises OSError naming the address; `weightstream serve` says so and exits 2."""
    taken = coordinator.grpc_address
    with pytest.raises(OSError, match=f"cannot bind the coordinator's gRPC API to {taken}: the port is"):
        serve_grpc(coordinator.service, TOKEN, taken)
    grpc_port, data_dir = taken.rsplit(":", 1)[1], str(tmp_path / "serve")
    r = subprocess.run(
        [*weightstream_cmd(), "serve", "--port", "0", "--grpc-port", grpc_port, "--data-dir", data_dir],
        env={**os.environ, "WEIGHTSTREAM_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "cannot bind the coordinator's gRPC API" in r.stderr and "choose another --grpc-port" in r.stderr

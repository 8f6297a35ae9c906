"""`weightstream serve` as a real process on a loopback port, driven by the client library and `wsctl`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose

from tests.integration.appliance import TINY, weightstream_cmd
from weightstream.data import make_data_processor
from weightstream.memoryx.storage import load_tensors
from weightstream.numerics import forward_loss
from weightstream.params import load_params, model_def
from weightstream_client import ApiError, Client

TOKEN = "test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, data_dir: Path, slots: int) -> None:
        self.data_dir, self.slots = data_dir, slots
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.clients: list[Client] = []

    def start(self) -> Service:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "WEIGHTSTREAM_TOKEN": TOKEN}
        log = open(self.data_dir.parent / f"serve-{port}.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.grpc_port = _free_port()
        self.proc = subprocess.Popen(
            [
                *weightstream_cmd(),
                "serve",
                "--port",
                str(port),
                "--grpc-port",
                str(self.grpc_port),
                "--data-dir",
                str(self.data_dir),
                "--slots",
                str(self.slots),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited: {(self.data_dir.parent / f'serve-{port}.log').read_text()}")
            time.sleep(0.1)
        pytest.fail("serve did not become healthy within 60s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for c in self.clients:
            c.close()
        self.clients.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> Client:
        c = Client(self.url, TOKEN)
        self.clients.append(c)
        return c


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    s = Service(tmp_path / "data", slots=2).start()
    yield s
    s.stop()


def _params(**runconfig: Any) -> dict[str, Any]:
    p = json.loads(json.dumps(TINY))
    p["runconfig"].update(runconfig)
    return p


def _role_pids(model_dir: Path) -> list[int]:
    return [json.loads(f.read_text())["pid"] for f in (model_dir / "logs").glob("*.ready.json")]


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.1)


def test_library_submit_follow_download_and_check_the_loss(service: Service, tmp_path: Path) -> None:
    client = service.client()
    job = client.submit(_params(max_steps=4, num_wgt_servers=2), num_csx=2, labels={"team": "a"})
    events: list[dict[str, Any]] = []
    info = job.wait(progress=False, on_event=events.append, timeout_s=300)
    assert info["status"] == "succeeded"
    assert [h["status"] for h in info["history"]] == ["queued", "running", "succeeded"]
    assert any(e["kind"] == "step" for e in events) and any(e["kind"] == "eval" for e in events)
    reported = job.metrics()["evals"][-1]
    path = job.download(tmp_path / "out")
    assert path.name == "checkpoint_4" and (path / "model.safetensors.index.json").exists()
    # the downloaded weights give the job's reported eval loss
    params = load_params(TINY)
    model = model_def(params)
    weights, step = load_tensors(path, "model", list(model.specs))
    assert step == 4
    data = make_data_processor(params.eval_input, params.model, "eval")
    losses = []
    for b in range(params.runconfig.eval_steps):
        x, y = data.global_batch(b)
        losses.append(forward_loss(model, weights, x, y, y.size))
    assert_allclose(np.mean(losses), reported["eval_loss"], rtol=1e-6)
    assert [j["id"] for j in client.jobs(labels={"team": "a"})] == [job.id]
    assert client.jobs(labels={"team": "b"}) == []


def test_wsctl_end_to_end(service: Service, tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(_params(max_steps=3)))
    env = {**os.environ, "WEIGHTSTREAM_URL": service.url, "WEIGHTSTREAM_TOKEN": TOKEN}
    wsctl = [
        shutil.which("wsctl") or sys.executable,
        *([] if shutil.which("wsctl") else ["-m", "weightstream_client.cli"]),
    ]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*wsctl, *args], env=env, capture_output=True, text=True, timeout=180, check=False
        )

    r = run(
        "submit", str(params), "--num_csx", "2", "--follow", "--label", "who=wsctl"
    )  # 180 s limit in run()
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    assert f"{job_id} succeeded" in r.stdout
    assert job_id in run("jobs", "--label", "who=wsctl").stdout
    assert json.loads(run("get", job_id).stdout)["status"] == "succeeded"
    assert "checkpoint" in run("logs", job_id).stdout
    r = run("download", job_id, str(tmp_path / "dl"))
    assert r.returncode == 0 and (tmp_path / "dl" / "checkpoint_3" / "trainer_state.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**_params(), "model": {**TINY["model"], "num_heads": 3}}))
    r = run("submit", str(bad))
    assert r.returncode == 2 and "model.hidden_size" in r.stderr
    r = run("cancel", job_id)
    assert r.returncode == 2 and "cannot become cancelled" in r.stderr
    assert run("get", "nope").returncode == 2


def test_capacity_priorities_and_cancel(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", slots=2).start()
    try:
        client = service.client()
        long_a = client.submit(_params(max_steps=100000), num_csx=2)
        _wait_for(lambda: long_a.status() == "running")
        low = client.submit(_params(max_steps=2), num_csx=2, priority=3)
        high = client.submit(_params(max_steps=2), num_csx=2, priority=1)
        doomed = client.submit(_params(max_steps=2), num_csx=1, priority=3)
        time.sleep(1.0)
        assert [low.status(), high.status(), doomed.status()] == ["queued"] * 3  # no slots: all wait
        assert doomed.cancel()["status"] == "cancelled"  # a queued job cancels at once
        model_dir = Path(long_a.info()["params"]["runconfig"]["model_dir"])
        _wait_for(lambda: len(_role_pids(model_dir)) == 6)
        pids = _role_pids(model_dir)
        _wait_for(lambda: bool(long_a.metrics()["steps"]))  # it is training
        scrape = httpx.get(f"{service.url}/metrics").text
        assert f'weightstream_job_step{{job="{long_a.id}"}}' in scrape
        for status, n in (("running", 1), ("queued", 2), ("cancelled", 1)):  # `doomed` was cancelled above
            assert f'weightstream_jobs{{status="{status}"}} {n}.0' in scrape
        long_a.cancel()
        _wait_for(lambda: long_a.status() == "cancelled")
        _wait_for(lambda: not any(_alive(p) for p in pids), timeout=20)  # its processes are gone
        for job in (high, low):
            job.wait(progress=False, timeout_s=120)
        started = {
            j.id: next(h["at"] for h in j.info()["history"] if h["status"] == "running") for j in (high, low)
        }
        assert started[high.id] < started[low.id]  # priority 1 ran before priority 3 submitted earlier
        with pytest.raises(ApiError) as e:
            long_a.cancel()
        assert e.value.status == 409
        with pytest.raises(ApiError) as e:
            client.submit(_params(), num_csx=3)
        assert e.value.status == 422 and e.value.code == "over_capacity"
    finally:
        service.stop()


def test_jobs_survive_a_killed_service(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", slots=1).start()
    client = service.client()
    running = client.submit(_params(max_steps=100000, autoload_last_checkpoint=False), num_csx=1)
    _wait_for(lambda: running.status() == "running")
    resumable = client.submit(_params(max_steps=100000), num_csx=1)  # autoload: resumes after a restart
    queued = client.submit(_params(max_steps=2), num_csx=1)
    model_dir = Path(running.info()["params"]["runconfig"]["model_dir"])
    _wait_for(lambda: len(_role_pids(model_dir)) == 5)
    pids = _role_pids(model_dir)
    service.stop(signal.SIGKILL)
    _wait_for(lambda: not any(_alive(p) for p in pids), timeout=20)  # roles follow their coordinator
    service.start()
    try:
        client = service.client()
        info = client.job(running.id).info()
        assert info["status"] == "failed" and "restart" in info["error"]
        assert client.job(resumable.id).status() in ("queued", "running")
        assert client.job(queued.id).status() == "queued"
        client.job(resumable.id).cancel()
        client.job(queued.id).wait(progress=False, timeout_s=120)
    finally:
        service.stop()


def test_every_v1_route_needs_the_token(service: Service) -> None:
    doc = httpx.get(f"{service.url}/openapi.json").json()
    routes = [(m, p) for p, ops in doc["paths"].items() for m in ops if p.startswith("/v1/")]
    assert len(routes) >= 8
    for method, path in routes:
        url = service.url + path.replace("{job_id}", "x").replace("{step}", "1").replace("{name}", "f")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            r = httpx.request(method.upper(), url, headers=headers, json={} if method == "post" else None)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_request_limits_and_errors(service: Service) -> None:
    h = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{service.url}/v1/jobs", headers=h, content=b"{" + b" " * (2 << 20) + b"}")
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    r = httpx.post(f"{service.url}/v1/jobs", headers=h, json={"params": {}, "num_csx": 0})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    r = httpx.post(
        f"{service.url}/v1/jobs", headers=h, json={"params": {**TINY, "sparsity": {}}, "num_csx": 1}
    )
    assert r.status_code == 422 and r.json()["error"]["details"][0]["path"] == "sparsity"
    assert httpx.get(f"{service.url}/v1/jobs/nope", headers=h).status_code == 404
    assert "weightstream_jobs" in httpx.get(f"{service.url}/metrics").text


def test_openapi_fuzzing_finds_no_server_error(service: Service) -> None:
    schemathesis = pytest.importorskip("schemathesis", reason="pip install -e .[test]")
    from hypothesis import HealthCheck, given, settings
    from schemathesis import checks

    # no 5xx, and every response as the schema documents it (status, content type, body, headers);
    # not "schema-valid data is accepted": a params object can match the JSON schema and still be
    # rejected by the params validation, with a documented 422
    wanted = [
        checks.not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
        checks.response_headers_conformance,
    ]
    schema = schemathesis.openapi.from_dict(httpx.get(f"{service.url}/openapi.json").json())
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(base_url=service.url, headers=headers, checks=wanted, timeout=30)

        check()


def test_coordinator_grpc_api(service: Service) -> None:
    import grpc

    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.proto import weightstream_pb2_grpc as rpc

    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = rpc.CoordinatorStub(channel)
        auth = (("authorization", f"Bearer {TOKEN}"),)
        with pytest.raises(grpc.RpcError) as e:
            stub.ListJobs(pb.ListJobsRequest(), metadata=(("authorization", "Bearer nope"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            bad = {**TINY, "model": {**TINY["model"], "num_heads": 3}}
            stub.SubmitJob(
                pb.SubmitJobRequest(params_json=json.dumps(bad), num_csx=1), metadata=auth, timeout=10
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "model.hidden_size" in e.value.details()
        reply = stub.SubmitJob(
            pb.SubmitJobRequest(
                params_json=json.dumps(_params(max_steps=2)), num_csx=1, labels={"via": "grpc"}
            ),
            metadata=auth,
            timeout=10,
        )
        job = json.loads(reply.job_json)
        kinds = [
            ev.kind for ev in stub.WatchJob(pb.WatchJobRequest(job_id=job["id"]), metadata=auth, timeout=120)
        ]
        assert "step" in kinds and "checkpoint" in kinds
        done = json.loads(stub.GetJob(pb.JobRequest(job_id=job["id"]), metadata=auth, timeout=10).job_json)
        assert done["status"] == "succeeded" and done["labels"] == {"via": "grpc"}
        listed = stub.ListJobs(pb.ListJobsRequest(labels={"via": "grpc"}), metadata=auth, timeout=10).job_json
        assert [json.loads(j)["id"] for j in listed] == [job["id"]]
        with pytest.raises(grpc.RpcError) as e:
            stub.CancelJob(pb.JobRequest(job_id=job["id"]), metadata=auth, timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as e:
            stub.GetJob(pb.JobRequest(job_id="nope"), metadata=auth, timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

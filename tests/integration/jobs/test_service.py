"""`weightstream serve` as a real process on a loopback port, driven by the client library and `wsctl`."""

from __future__ import annotations

import json
import os
import shutil
import signal
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
from numpy.testing import assert_allclose, assert_array_equal

from tests.integration.appliance import TINY, metrics, run_uninterrupted
from tests.integration.jobs.service_process import (
    TOKEN,
    Service,
    alive,
    checkpoint_tensors,
    job_params,
    logged_steps,
    role_pids,
    stop_leftovers,
    wait_for,
)
from weightstream.checkpoint_layout import complete_checkpoints
from weightstream.data import make_data_processor
from weightstream.memoryx.storage import load_tensors
from weightstream.numerics import forward_loss
from weightstream.params import load_params, model_def
from weightstream_client import ApiError


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    s = Service(tmp_path / "data", slots=2).start()
    yield s
    s.stop()


def test_library_submit_follow_download_and_check_the_loss(service: Service, tmp_path: Path) -> None:
    client = service.client()
    job = client.submit(job_params(max_steps=4, num_wgt_servers=2), num_csx=2, labels={"team": "a"})
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
    assert params.eval_input is not None
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
    params.write_text(yaml.safe_dump(job_params(max_steps=3)))
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
    assert json.loads(run("get", "job", job_id, "-o", "json").stdout)["status"] == "succeeded"
    assert "checkpoint" in run("logs", job_id).stdout
    r = run("download", job_id, str(tmp_path / "dl"))
    assert r.returncode == 0 and (tmp_path / "dl" / "checkpoint_3" / "trainer_state.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**job_params(), "model": {**TINY["model"], "num_heads": 3}}))
    r = run("submit", str(bad))
    assert r.returncode == 2 and "model.hidden_size" in r.stderr
    r = run("cancel", "job", job_id)
    assert r.returncode == 2 and "cannot become cancelled" in r.stderr
    assert run("get", "job", "nope").returncode == 2


@pytest.mark.slow  # ~13-15 s: the default suite stays well under 10 minutes
def test_capacity_priorities_and_cancel(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", slots=2).start()
    try:
        client = service.client()
        long_a = client.submit(job_params(max_steps=100000), num_csx=2)
        wait_for(lambda: long_a.status() == "running", "long_a to run")
        low = client.submit(job_params(max_steps=2), num_csx=2, priority=3)
        high = client.submit(job_params(max_steps=2), num_csx=2, priority=1)
        doomed = client.submit(job_params(max_steps=2), num_csx=1, priority=3)
        time.sleep(1.0)
        assert [low.status(), high.status(), doomed.status()] == ["queued"] * 3  # no slots: all wait
        assert doomed.cancel()["status"] == "cancelled"  # a queued job cancels at once
        model_dir = Path(long_a.info()["params"]["runconfig"]["model_dir"])
        wait_for(lambda: len(role_pids(model_dir)) == 6, "its six roles to be ready")
        pids = role_pids(model_dir)
        wait_for(lambda: bool(long_a.metrics()["steps"]), "long_a's first step")  # it is training
        scrape = httpx.get(f"{service.url}/metrics").text
        assert f'weightstream_job_step{{job="{long_a.id}"}}' in scrape
        for status, n in (("running", 1), ("queued", 2), ("cancelled", 1)):  # `doomed` was cancelled above
            assert f'weightstream_jobs{{status="{status}"}} {n}.0' in scrape
        long_a.cancel()
        wait_for(lambda: long_a.status() == "cancelled", "long_a to be cancelled")
        wait_for(lambda: not any(alive(p) for p in pids), "its processes to end", 20)
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
            client.submit(job_params(), num_csx=3)
        assert e.value.status == 422 and e.value.code == "over_capacity"
    finally:
        service.stop()


def test_jobs_survive_a_killed_service(tmp_path: Path) -> None:
    service = Service(tmp_path / "data", slots=1).start()
    try:
        client = service.client()
        running = client.submit(job_params(max_steps=100000, autoload_last_checkpoint=False), num_csx=1)
        wait_for(lambda: running.status() == "running", "the first job to run")
        resumable = client.submit(
            job_params(max_steps=100000), num_csx=1
        )  # autoload: resumes after a restart
        queued = client.submit(job_params(max_steps=2), num_csx=1)
        model_dir = Path(running.info()["params"]["runconfig"]["model_dir"])
        wait_for(lambda: len(role_pids(model_dir)) == 5, "its five roles to be ready")
        pids = role_pids(model_dir)
        service.stop(signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in pids), "the roles to follow their coordinator", 20)
        service.start()
        client = service.client()
        info = client.job(running.id).info()
        assert info["status"] == "failed" and "restart" in info["error"]
        assert client.job(resumable.id).status() in ("queued", "running")
        assert client.job(queued.id).status() == "queued"
        client.job(resumable.id).cancel()
        client.job(queued.id).wait(progress=False, timeout_s=120)
    finally:
        service.stop()  # also when an assertion above failed: no service left running


@pytest.mark.slow  # ~12-14 s: the default suite stays under ~9 minutes
def test_killed_service_resumes_a_running_job_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """SIGKILL of the service while a job trains past a checkpoint, then a restart on the same data dir:
    the job is requeued (its history says why), resumes from its last checkpoint (not from step 0), redoes
    the steps after it, succeeds, and ends with bitwise the weights, optimizer state and losses of an
    uninterrupted `weightstream run` of the same params at the same num_csx; no role process is left."""
    max_steps, every = 40, 8  # ~40 ms a step here: seconds of training, a checkpoint early on
    params = job_params(max_steps=max_steps, checkpoint_steps=every)
    service = Service(tmp_path / "data", slots=1).start()
    pids: set[int] = set()
    model_dir = tmp_path / "unset"
    try:
        job = service.client().submit(params, num_csx=1)
        model_dir = Path(job.info()["params"]["runconfig"]["model_dir"])
        wait_for(lambda: len(role_pids(model_dir)) == 5, "2 MemoryX, SwarmX, activation, worker ready")
        pids.update(role_pids(model_dir))

        def past_a_checkpoint() -> bool:  # killed between checkpoints: the steps after one are redone
            if job.status() != "running":  # fail now rather than at the timeout
                pytest.fail(f"job is {job.status()} before the kill: {job.info().get('error')}")
            cps = complete_checkpoints(model_dir)
            return bool(cps) and max(logged_steps(model_dir), default=0) > cps[-1][0]

        wait_for(past_a_checkpoint, "a step past a checkpoint", 120)
        service.stop(signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in pids), "the roles to follow the service", 20)
        done_before = max(logged_steps(model_dir))
        resume_step = complete_checkpoints(model_dir)[-1][0]
        assert every <= resume_step < done_before < max_steps, (resume_step, done_before)

        service.start()
        job = service.client().job(job.id)
        info = job.wait(progress=False, timeout_s=180)
        pids.update(role_pids(model_dir))
        wait_for(lambda: not any(alive(p) for p in pids), "the resumed run's roles to end", 20)
        history = info["history"]
        assert [h["status"] for h in history] == ["queued", "running", "queued", "running", "succeeded"]
        assert "service restarted" in history[2]["reason"]

        # resumed from the last checkpoint: a 'resuming' event naming it, then steps after it only
        events = [e for e in job.events(follow=False) if e["kind"] != "keepalive"]
        statuses = [(i, e["status"]) for i, e in enumerate(events) if e["kind"] == "status"]
        requeued = [i for i, status in statuses if status == "queued"][-1]  # the restart's, not the submit's
        resuming = [
            i for i, e in enumerate(events) if e["kind"] == "progress" and e.get("status") == "resuming"
        ]
        assert len(resuming) == 1, f"{len(resuming)} 'resuming' events: the job did not resume exactly once"
        assert resuming[0] > requeued, "the job resumed before the restart requeued it"
        assert events[resuming[0]]["step"] == resume_step
        after = [e["step"] for e in events[resuming[0] :] if e["kind"] == "step"]
        assert after == list(range(resume_step + 1, max_steps + 1))
        assert f"resuming from {model_dir / f'checkpoint_{resume_step}'}" in job.logs()

        # the same run without the interruption: num_csx 1, same params (`weightstream run`)
        straight = run_uninterrupted(tmp_path, params)
        straight_losses, _ = metrics(straight)
        rows = job.metrics()["steps"]  # the resume dropped the records after its checkpoint: each step once
        assert [row["step"] for row in rows] == list(range(1, max_steps + 1)), (resume_step, done_before)
        for row in rows:
            assert row["loss"] == straight_losses[row["step"]], f"step {row['step']}"
        for prefix in ("model", "optimizer"):
            got = checkpoint_tensors(model_dir / f"checkpoint_{max_steps}", prefix)
            want = checkpoint_tensors(straight / f"checkpoint_{max_steps}", prefix)
            assert sorted(got) == sorted(want) and got
            for name, w in want.items():
                assert_array_equal(got[name], w, err_msg=f"{prefix} {name}")
                assert got[name].tobytes() == w.tobytes(), f"{prefix} {name}: equal, but not bitwise"
    finally:
        service.stop()
        stop_leftovers(pids | set(role_pids(model_dir) if model_dir.is_dir() else []), model_dir)


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
    assert r.status_code == 422 and r.json()["error"]["details"][0]["path"] == "sparsity.sparsity"
    assert httpx.get(f"{service.url}/v1/jobs/nope", headers=h).status_code == 404
    assert "weightstream_jobs" in httpx.get(f"{service.url}/metrics").text


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
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "model.hidden_size" in (e.value.details() or "")
        reply = stub.SubmitJob(
            pb.SubmitJobRequest(
                params_json=json.dumps(job_params(max_steps=2)), num_csx=1, labels={"via": "grpc"}
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

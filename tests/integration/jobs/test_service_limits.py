"""The service's limits with real jobs and a real `weightstream serve`: REST and gRPC refuse alike, a job
runs out of time with a clear message, old checkpoints go, and cancel at any moment is never a 5xx."""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.jobs.service_process import (
    TOKEN,
    Service,
    alive,
    job_params,
    role_pids,
    stop_leftovers,
    wait_for,
)
from weightstream.checkpoint_layout import complete_checkpoints
from weightstream.jobs.service import JobService, ServiceConfig, ServiceLimits

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _text_job(data_dir: str) -> dict[str, Any]:
    p = job_params()
    p["model"]["vocab_size"] = 256
    p["train_input"].update(data_processor="TextFileDataProcessor", data_dir=data_dir)
    del p["eval_input"]
    return p


def test_rest_and_grpc_refuse_through_the_same_checks(tmp_path: Path) -> None:
    """A service that queues nothing (--max-queued-jobs 0): a valid job is 429 over REST and
    RESOURCE_EXHAUSTED over gRPC; a bad priority, an oversized model or data outside the roots are refused
    by both with the key named; a path outside the roots reads the same whether it exists or not."""
    import grpc

    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.proto import weightstream_pb2_grpc as rpc

    roots = tmp_path / "datasets"
    roots.mkdir()
    service = Service(tmp_path / "data", 1, "--max-queued-jobs", "0", "--data-root", str(roots)).start()
    try:
        url = f"{service.url}/v1/jobs"
        r = httpx.post(url, headers=AUTH, json={"params": job_params(), "num_csx": 1})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
        huge = job_params()
        huge["model"].update(hidden_size=10**9, num_heads=1)
        r = httpx.post(url, headers=AUTH, json={"params": huge, "num_csx": 1})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["path"] == "model.hidden_size"
        assert "--max-params" in r.json()["error"]["details"][0]["message"]
        messages = []
        for outside in ("/etc", str(tmp_path / "no-such-dir")):
            r = httpx.post(url, headers=AUTH, json={"params": _text_job(outside), "num_csx": 1})
            assert r.status_code == 422, r.text
            (detail,) = r.json()["error"]["details"]
            assert detail["path"] == "train_input.data_dir" and detail["value"] == outside
            messages.append(detail["message"])
        assert messages[0] == messages[1] and "outside the service's data roots" in messages[0]

        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = rpc.CoordinatorStub(channel)
            auth = (("authorization", f"Bearer {TOKEN}"),)

            def submit(params: dict[str, Any], **fields: Any) -> grpc.RpcError:
                request = pb.SubmitJobRequest(params_json=json.dumps(params), num_csx=1, **fields)
                with pytest.raises(grpc.RpcError) as e:
                    stub.SubmitJob(request, metadata=auth, timeout=30)
                return e.value

            e = submit(job_params(), priority=-1000)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "priority" in (e.details() or "")
            e = submit(_text_job("/etc"))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "data roots" in (e.details() or "")
            e = submit(job_params())
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
        assert httpx.get(url, headers=AUTH).json()["jobs"] == []
    finally:
        service.stop()


@pytest.mark.slow  # ~12-14 s: the default suite stays under ~9 minutes
def test_a_job_out_of_time_fails_naming_its_limit_and_old_checkpoints_go(tmp_path: Path) -> None:
    """A real JobService running real jobs: one that would train for hours fails at the service's
    wall-clock limit with a message naming it and the last checkpoint; one that checkpoints every step
    keeps only the service's default number of checkpoints (params that set none)."""
    limits = ServiceLimits(max_job_seconds=8, keep_checkpoint_max=2)
    service = JobService(ServiceConfig(tmp_path / "data", slots=1, limits=limits))
    pids: set[int] = set()
    try:
        short = service.submit(job_params(max_steps=5, checkpoint_steps=1, rpc_timeout_s=8), num_csx=1)
        endless = service.submit(
            job_params(max_steps=500_000, checkpoint_steps=5, rpc_timeout_s=8), num_csx=1
        )
        wait_for(lambda: service.is_terminal(short.id), "the short job to end", 120)
        pids.update(role_pids(Path(short.model_dir)))
        assert service.store.get(short.id).status == "succeeded", service.store.get(short.id).error
        assert [s for s, _ in complete_checkpoints(Path(short.model_dir))] == [4, 5]
        assert "removed checkpoint" in (Path(short.model_dir) / "run.log").read_text()

        started = time.monotonic()
        wait_for(lambda: service.is_terminal(endless.id), "the endless job to end")
        record = service.store.get(endless.id)
        pids.update(role_pids(Path(endless.model_dir)))
        assert record.status == "failed"
        assert "job exceeded its wall-clock limit of 8 s at step" in (record.error or ""), record.error
        last = complete_checkpoints(Path(endless.model_dir))
        if last:  # the message names the checkpoint a resubmission could start from
            assert f"its last checkpoint is {last[-1][1]} (step {last[-1][0]})" in (record.error or "")
        assert time.monotonic() - started < 60  # generous: the limit is 8 s from the job's start
        wait_for(lambda: not any(alive(p) for p in pids), "every role to end", 20)
    finally:
        service.shutdown()
        stop_leftovers(pids, tmp_path)


def test_cancel_at_any_moment_is_never_a_server_error(tmp_path: Path) -> None:
    """Jobs cancelled over REST while queued, starting (roles being spawned), running or just finished,
    some twice at once: every answer is 200 or 409, every job ends, and no role process is left."""
    service = Service(tmp_path / "data", 2).start()
    rng = random.Random(7)
    codes: list[int] = []
    lock = threading.Lock()
    jobs: list[str] = []
    client = httpx.Client(base_url=service.url, headers=AUTH, timeout=60)
    try:

        def cancel_after(job_id: str, delay: float) -> None:
            time.sleep(delay)
            r = client.delete(f"/v1/jobs/{job_id}")
            with lock:
                codes.append(r.status_code)

        def ended(job_id: str) -> bool:
            return client.get(f"/v1/jobs/{job_id}").json()["status"] in ("succeeded", "cancelled", "failed")

        for delays in ([0.0, 0.0], [0.02, 0.05], [0.1, 0.2], [0.3, 0.5], [0.8, 1.2], [1.5, 2.0]):
            threads = []
            for d in delays:
                steps = 2 if rng.random() < 0.3 else 100_000  # a short one may be done before its cancel
                r = client.post("/v1/jobs", json={"params": job_params(max_steps=steps), "num_csx": 1})
                assert r.status_code == 201, r.text
                job_id = r.json()["id"]
                jobs.append(job_id)
                for extra in (0.0, 0.01):  # two cancels racing each other as well as the start
                    threads.append(threading.Thread(target=cancel_after, args=(job_id, d + extra)))
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            for job_id in jobs[-len(delays) :]:
                wait_for(functools.partial(ended, job_id), f"job {job_id} to end")
        assert codes and set(codes) <= {200, 409}, codes
        statuses = [client.get(f"/v1/jobs/{j}").json() for j in jobs]
        assert all(s["status"] in ("succeeded", "cancelled") for s in statuses), [
            (s["status"], s["error"]) for s in statuses
        ]
        pids = [p for j in statuses for p in role_pids(Path(j["params"]["runconfig"]["model_dir"]))]
        wait_for(lambda: not any(alive(p) for p in pids), "every role to end", 20)
    finally:  # closed on a failure too: a leaked socket's ResourceWarning would fail a later test
        client.close()
        service.stop()


def test_serve_takes_data_roots_from_the_environment_and_refuses_a_missing_one(tmp_path: Path) -> None:
    """WEIGHTSTREAM_DATA_ROOTS is colon-separated; a root that is not there stops `serve` at once (exit 2,
    naming it) rather than leaving every job to fail on it."""
    import os
    import subprocess

    from tests.integration.appliance import weightstream_cmd

    (tmp_path / "a").mkdir()
    env = {
        **os.environ,
        "WEIGHTSTREAM_TOKEN": TOKEN,
        "WEIGHTSTREAM_DATA_ROOTS": f"{tmp_path / 'a'}:{tmp_path / 'b'}",
    }
    cmd = [*weightstream_cmd(), "serve", "--port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "d")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"data root {tmp_path / 'b'} is not a directory" in r.stderr
    r = subprocess.run(
        [*cmd, "--data-root", str(tmp_path / "d" / "jobs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "overlaps the service's job directory" in r.stderr

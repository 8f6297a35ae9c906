"""Fault recovery seen through the service: a job submitted with `wsctl` to a real `weightstream serve` loses
a worker, a MemoryX shard and a SwarmX node to SIGKILL while it trains, and succeeds; its restarts show in
the events (REST server-sent events and gRPC WatchJob alike), `wsctl submit --follow`, `wsctl logs` and
/metrics, and its final checkpoint is bitwise the one of a fault-free `weightstream run`."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from tests.integration.appliance import TINY, run
from tests.integration.jobs.service_process import TOKEN, Service
from tests.waiting import wait_until
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc

STEPS = 100
# (role, the step after which it is killed): each fault is recovered before the next one lands. The
# shard's loss sends every shard back to the recovery snapshot of step 40, so steps are replayed.
VICTIMS = (("worker-1", 20), ("memoryx-0", 45), ("swarmx-0", 70))
KIND = {"worker-1": "worker", "memoryx-0": "memoryx", "swarmx-0": "swarmx"}


def _wsctl(*args: str) -> list[str]:
    exe = shutil.which("wsctl")
    return [*([exe] if exe else [sys.executable, "-m", "weightstream_client.cli"]), *args]


def _env(url: str) -> dict[str, str]:
    return {**os.environ, "WEIGHTSTREAM_URL": url, "WEIGHTSTREAM_TOKEN": TOKEN}


def logged_steps(model_dir: Path) -> int:
    """Steps done so far: metrics.jsonl gets one line per logged step (log_steps 1), none for a replay."""
    f = model_dir / "metrics.jsonl"
    return sum('"loss"' in line for line in f.read_text().splitlines()) if f.exists() else 0


@pytest.mark.slow  # ~20 s
def test_a_job_recovers_from_killed_roles_and_the_service_shows_every_restart(tmp_path: Path) -> None:
    params = json.loads(json.dumps(TINY))
    params["runconfig"].update(
        max_steps=STEPS, log_steps=1, rpc_timeout_s=10.0, recovery_snapshot_steps=10, num_wgt_servers=2
    )
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    service = Service(tmp_path / "data", slots=2).start()
    try:
        client = service.client()
        follow = subprocess.Popen(  # over REST, as a user submits and watches
            _wsctl("submit", str(params_file), "--num_csx", "2", "--follow", "--label", "t=recovery"),
            env=_env(service.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: client.jobs(labels={"t": "recovery"}), "the submission", 60, poll_s=0.02)
            job = client.job(client.jobs(labels={"t": "recovery"})[0]["id"])
            model_dir = Path(job.info()["params"]["runconfig"]["model_dir"])
            killed: dict[str, int] = {}
            for role, after in VICTIMS:
                reached = functools.partial(lambda n: logged_steps(model_dir) >= n, after)
                wait_until(reached, f"step {after}", 60, poll_s=0.02)
                pid = json.loads((model_dir / "logs" / f"{role}.ready.json").read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed[role] = pid
            out, err = follow.communicate(timeout=180)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
        assert follow.returncode == 0, err
        assert f"{job.id} succeeded" in out, out
        # wsctl submit --follow: one line per restart with the budget, one per recovery
        for n, (role, _) in enumerate(VICTIMS, start=1):
            assert f"restart {n}/50: {role} (pid {killed[role]}) was killed by SIGKILL" in out, out
        recovered = re.findall(
            r"^step (\d+)  recovered in [\d.]+s \(replaying (\d+) steps?\): (.*)$", out, re.M
        )
        assert len(recovered) == 3 and int(recovered[1][1]) >= 5, out  # the shard's loss: steps replayed
        assert all(action.startswith("replaced ") for _, _, action in recovered), out  # what was done

        # the same events over REST (server-sent events) and gRPC (WatchJob)
        sse = [e for e in job.events(follow=False) if e["kind"] in ("restart", "retry", "recovered")]
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stream = rpc.CoordinatorStub(channel).WatchJob(
                pb.WatchJobRequest(job_id=job.id),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=30,
            )
            watched = [{"seq": e.seq, "kind": e.kind, **json.loads(e.data_json)} for e in stream]
        assert [e for e in watched if e["kind"] in ("restart", "retry", "recovered")] == sse
        restarts = [e for e in sse if e["kind"] == "restart"]
        assert [(e["role"], e["restarts"], e["max_role_restarts"]) for e in restarts] == [
            (role, n, 50) for n, (role, _) in enumerate(VICTIMS, start=1)
        ]
        assert [e["generation"] for e in sse if e["kind"] == "recovered"] == [1, 2, 3]
        # every recovery names every role's address, a replacement's new one included (the dashboard's roles)
        started = next(e for e in job.events(follow=False) if "addresses" in e)["addresses"]
        for e in (e for e in sse if e["kind"] == "recovered"):
            assert {k: len(v) for k, v in e["addresses"].items()} == {k: len(v) for k, v in started.items()}

        # /metrics: the counter by kind, every kind present, equal to the stored restart events
        scrape = httpx.get(f"{service.url}/metrics").text
        by_kind = Counter(e["role_kind"] for e in restarts)
        for kind in ("worker", "swarmx", "memoryx", "activation"):
            line = f'weightstream_role_restarts_total{{kind="{kind}"}} {float(by_kind[kind])}'
            assert line in scrape, scrape
        assert all(by_kind[k] >= 1 for k in KIND.values())

        # wsctl logs: the job's run.log, where the coordinator logs each fault and recovery
        logs = subprocess.run(
            _wsctl("logs", job.id), env=_env(service.url), capture_output=True, text=True, timeout=60
        )
        assert logs.returncode == 0, logs.stderr
        for role, pid in killed.items():
            assert f"{role} (pid {pid}) was killed by SIGKILL" in logs.stdout, logs.stdout
        assert logs.stdout.count("recovered in") == 3, logs.stdout

        # wsctl get job: the restarts by kind and the workers it trains with, under the job's row
        shown = subprocess.run(
            _wsctl("get", "job", job.id), env=_env(service.url), capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
        assert f"RESTARTS   3 ({kinds})" in shown.stdout and "WORKERS    2 of 2" in shown.stdout, shown.stdout
        faults = job.info()["faults"]
        assert faults["restarts"] == dict(by_kind) and faults["workers"] == 2, faults
        resolved = job.info()["params"]
    finally:
        service.stop()

    # the same params without a fault, with `weightstream run`: the same bytes
    straight_params = tmp_path / "straight.yaml"
    straight_params.write_text(yaml.safe_dump(resolved))
    straight = tmp_path / "straight"
    r = run(straight_params, straight, timeout=120)
    assert r.returncode == 0, r.stderr
    got, want = model_dir / f"checkpoint_{STEPS}", straight / f"checkpoint_{STEPS}"
    files = sorted(p.name for p in want.glob("*.safetensors"))
    assert files and files == sorted(p.name for p in got.glob("*.safetensors"))
    for name in files:
        assert (got / name).read_bytes() == (want / name).read_bytes(), name

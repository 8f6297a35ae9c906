"""How many CS-2 a submitted job gets: what its params say (runconfig.num_csx), unless the submission
overrides it, through REST, `wsctl submit` and the library alike, as `weightstream run` does."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import TOKEN, LiveApi
from weightstream_client import Client


def _wsctl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("wsctl")
    cmd = [exe] if exe else [sys.executable, "-c", "from weightstream_client.cli import main; main()"]
    env = {**os.environ, "WEIGHTSTREAM_URL": url, "WEIGHTSTREAM_TOKEN": TOKEN}
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_params_num_csx_is_used_unless_the_submission_overrides_it(tmp_path: Path) -> None:
    params = copy.deepcopy(TINY)
    params["runconfig"]["num_csx"] = 2
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with LiveApi(tmp_path / "data", slots=4) as live, live.http() as http, Client(live.url, TOKEN) as client:
        r = http.post("/v1/jobs", json={"params": params})  # num_csx left out
        assert r.status_code == 201 and r.json()["num_csx"] == 2, r.text
        r = http.post("/v1/jobs", json={"params": params, "num_csx": None})
        assert r.status_code == 201 and r.json()["num_csx"] == 2, r.text
        assert http.post("/v1/jobs", json={"params": params, "num_csx": 4}).json()["num_csx"] == 4
        r = http.post(
            "/v1/jobs", json={"params": {**params, "runconfig": {**params["runconfig"], "num_csx": 8}}}
        )
        assert r.status_code == 422 and r.json()["error"]["code"] == "over_capacity", r.text

        assert client.submit(params).info()["num_csx"] == 2
        assert client.submit(params, num_csx=1).info()["num_csx"] == 1

        cli = _wsctl(live.url, "submit", str(path))
        assert cli.returncode == 0, cli.stderr
        assert client.job(cli.stdout.split()[0]).info()["num_csx"] == 2
        cli = _wsctl(live.url, "submit", str(path), "--num_csx", "4")
        assert cli.returncode == 0, cli.stderr
        assert client.job(cli.stdout.split()[0]).info()["num_csx"] == 4
        openapi = json.loads(http.get("/openapi.json").text)
        assert "num_csx" not in openapi["components"]["schemas"]["SubmitRequest"].get("required", [])


def test_grpc_num_csx_0_means_the_params(tmp_path: Path) -> None:
    """proto3 sends an unset num_csx as 0: the params' runconfig.num_csx, as REST without the field."""
    import grpc

    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.proto import weightstream_pb2_grpc as rpc

    params = copy.deepcopy(TINY)
    params["runconfig"]["num_csx"] = 2
    auth = (("authorization", f"Bearer {TOKEN}"),)
    with (
        LiveApi(tmp_path / "data", slots=4, grpc=True) as live,
        grpc.insecure_channel(live.grpc_address) as ch,
    ):
        stub = rpc.CoordinatorStub(ch)
        for sent, got in ((0, 2), (4, 4)):
            request = pb.SubmitJobRequest(params_json=json.dumps(params), num_csx=sent)
            reply = stub.SubmitJob(request, metadata=auth, timeout=30)
            assert json.loads(reply.job_json)["num_csx"] == got

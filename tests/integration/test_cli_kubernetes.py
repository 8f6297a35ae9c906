"""`weightstream plan --backend kubernetes` and `weightstream health` as a user (and a pod's probe) runs them:
real subprocesses through the installed entry point, a real role process on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.appliance import TINY, weightstream_cmd
from tests.waiting import wait_until

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a test dependency: pip install -e .[test]"
)
API_TOKEN = "the-services-api-token-must-never-reach-a-pod"


def weightstream(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*weightstream_cmd(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def params(tmp_path: Path) -> Path:
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"]["num_csx"] = 2
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _pods(docs: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "Pod" and d["metadata"]["labels"]["weightstream.io/role"] == role]


def test_plan_shows_the_hardened_objects_as_the_service_creates_them(params: Path) -> None:
    r = weightstream(
        "plan", str(params), "--backend", "kubernetes", "--data-claim", "ws-data", "-o", "yaml",
        env={"WEIGHTSTREAM_TOKEN": API_TOKEN},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert API_TOKEN not in r.stdout
    assert "&id" not in r.stdout  # plain YAML, no anchors: what a reader (or kubectl diff) expects
    docs = list(yaml.safe_load_all(r.stdout))
    version = kv.latest_version()
    for doc in docs:
        kv.validate(doc, version, strict=True)
    kinds = [d["kind"] for d in docs]
    assert kinds[:4] == ["ConfigMap", "Service", "Secret", "NetworkPolicy"] and kinds.count("Pod") == 6
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["stringData"] == {"token": "<generated per job run>"}  # never a real credential
    for pod in (d for d in docs if d["kind"] == "Pod"):
        spec, [c] = pod["spec"], pod["spec"]["containers"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "WEIGHTSTREAM_TOKEN" not in {e["name"] for e in c["env"]}
    # the service's layout with --data-dir /data: job "preview" in /data/jobs/preview, data in /data/datasets
    for shard in _pods(docs, "memoryx"):
        [job_dir] = [m for m in shard["spec"]["containers"][0]["volumeMounts"] if m["name"] == "data"]
        assert job_dir == {"name": "data", "mountPath": "/data/jobs/preview", "subPath": "jobs/preview"}
    [activation] = _pods(docs, "activation")
    [data] = [m for m in activation["spec"]["containers"][0]["volumeMounts"] if m["name"] == "data"]
    assert data == {"name": "data", "mountPath": "/data/datasets", "subPath": "datasets", "readOnly": True}
    assert json.loads(docs[0]["data"]["params.json"])["runconfig"]["model_dir"] == "/data/jobs/preview"


def test_plan_takes_the_services_data_roots_and_refuses_what_it_would_refuse(params: Path) -> None:
    base = ("plan", str(params), "--backend", "kubernetes", "--data-claim", "ws-data", "--job-id", "j7")
    r = weightstream(*base, "--data-root", "/data/corpora", "--data-root", "/data/more", "-o", "json")
    assert r.returncode == 0, r.stderr
    [activation] = _pods(json.loads(r.stdout), "activation")
    mounts = activation["spec"]["containers"][0]["volumeMounts"]
    assert [(m["subPath"], m.get("readOnly")) for m in mounts if m["name"] == "data"] == [
        ("corpora", True),
        ("more", True),
    ]
    r = weightstream(*base, "--data-root", "/data")  # the whole volume: the job store and every job
    assert r.returncode == 2 and "overlaps the service's job directory" in r.stderr
    r = weightstream(*base, "--data-root", "/srv/corpora")
    assert r.returncode == 2 and "data_roots: '/srv/corpora' must be a directory strictly inside" in r.stderr
    r = weightstream(*base, "--data-dir", "/srv/ws", "--data-root", "/data/datasets")  # job dirs off /data
    assert r.returncode == 2 and "runconfig.model_dir: '/srv/ws/jobs/j7'" in r.stderr


def test_plan_and_serve_without_a_data_claim_say_it_is_needed(params: Path, tmp_path: Path) -> None:
    """A job's pods write its checkpoints to, and read its data from, the service's data volume: without
    one no manifest could run, so both exit 2 naming the option instead of printing broken pods."""
    r = weightstream("plan", str(params), "--backend", "kubernetes", "-o", "yaml")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "--backend kubernetes needs --data-claim NAME" in " ".join(r.stderr.split()), r.stderr
    pytest.importorskip("kubernetes", reason="serve checks for the client first")
    r = weightstream(
        "serve", "--backend", "kubernetes", "--data-dir", str(tmp_path / "d"), "--port", "0",
        env={"WEIGHTSTREAM_TOKEN": API_TOKEN},
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--backend kubernetes needs --data-claim NAME" in " ".join(r.stderr.split()), r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_health_finds_the_role_through_the_environment_as_the_pods_probe_does(tmp_path: Path) -> None:
    """Role pods listen on their pod's IP only and run `weightstream health` with no arguments, the
    address coming from WEIGHTSTREAM_ROLE_ADDRESS; here the role listens on a loopback port that is not
    the default one."""
    ready = tmp_path / "ready.json"
    role = subprocess.Popen(
        [*weightstream_cmd(), "worker", "--port", "0", "--ready-file", str(ready), "--token-file", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert role.stdin is not None
        role.stdin.write(b"ab" * 32 + b"\n")
        role.stdin.close()

        def ready_while_running() -> bool:
            assert role.poll() is None, "the role ended before it was ready"
            return ready.exists()

        wait_until(ready_while_running, "the role's ready file", 30)
        address = json.loads(ready.read_text())["address"]
        r = weightstream("health", env={"WEIGHTSTREAM_ROLE_ADDRESS": address})
        assert r.returncode == 0, r.stderr
        assert f"serving: {address}" in r.stdout  # no credential: the role says nothing more
    finally:
        role.terminate()
        role.wait(timeout=10)
    nobody = f"127.0.0.1:{_free_port()}"
    r = weightstream("health", "--timeout", "1", env={"WEIGHTSTREAM_ROLE_ADDRESS": nobody})
    assert r.returncode == 1 and f"unhealthy: {nobody}" in r.stderr

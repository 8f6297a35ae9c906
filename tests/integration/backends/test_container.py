"""The image really builds and the pods the Kubernetes backend generates really train, under podman.

Marked ``container``: it needs a container engine (``../shared/tools/container-setup`` provides podman
here; .ci/run runs it) and skips, saying why, where there is none. The pods are exactly the ones
``job_manifests`` generates for a 2-worker job; what differs from a cluster is configuration only: the
data volume is a host directory mounted at the same path (instead of a PVC), and roles are addressed by
their pod IPs on a podman network (instead of the headless Service's DNS names). The coordinator is the
ordinary ``JobRunner`` in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.appliance import TINY
from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.kubernetes.manifests import ClusterConfig, job_manifests, pod_name
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan
from weightstream.training.runner import JobRunner

pytestmark = pytest.mark.container
ROOT = Path(__file__).parents[3]
IMAGE = "localhost/weightstream:test"


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed: {r.stderr[-2000:]}")
    return r


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.skip("no container engine: run ../shared/tools/container-setup (podman) first")
    if _podman("info", check=False).returncode != 0:
        pytest.skip("podman is installed but cannot run containers here")
    r = subprocess.run(
        ["podman", "build", "--network", "host", "-t", IMAGE, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert r.returncode == 0, f"image build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return IMAGE


def test_image_runs_every_role_entry_point(image: str) -> None:
    out = _podman("run", "--rm", image, "--help").stdout
    for command in ("run", "serve", "plan", "memoryx", "swarmx", "worker", "activation"):
        assert command in out
    user = _podman("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip()
    assert user == "10001"  # not root


class PodmanPlayedBackend:
    """The generated pods, played by podman; addresses are the pods' IPs on a podman network."""

    def __init__(self, manifest: Path, network: str, roles: list[RoleSpec], job_id: str) -> None:
        self.manifest, self.network, self.roles, self.job_id = manifest, network, roles, job_id
        self._stopping = False

    def _container(self, role: RoleSpec) -> str:
        return (
            f"{pod_name(self.job_id, role)}-{role.kind}"  # podman names a pod's container <pod>-<container>
        )

    def start(self, roles: list[RoleSpec]) -> None:
        _podman("kube", "play", "--network", self.network, str(self.manifest), timeout=300)

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout_s
        out: dict[str, list[str]] = {}
        for role in self.roles:
            info = json.loads(_podman("inspect", self._container(role)).stdout)[0]
            ip = info["NetworkSettings"]["Networks"][self.network]["IPAddress"]
            while True:  # listening?
                try:
                    socket.create_connection((ip, 50051), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise BackendError(f"{role.name} at {ip} not listening") from None
                    time.sleep(0.2)
            out.setdefault(role.kind, []).append(f"{ip}:50051")
        return out

    def failures(self) -> list[str]:
        if self._stopping:
            return []
        dead = []
        for role in self.roles:
            state = json.loads(_podman("inspect", self._container(role)).stdout)[0]["State"]
            if state["Status"] != "running":
                dead.append(f"{role.name} {state['Status']} (exit code {state.get('ExitCode')})")
        return dead

    def stop(self) -> None:
        self._stopping = True
        _podman("kube", "down", str(self.manifest), timeout=120, check=False)


def test_generated_pods_train_a_two_worker_job(image: str, tmp_path: Path) -> None:
    job_id = uuid.uuid4().hex[:8]
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the pods run as the image's non-root user
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(max_steps=3, num_csx=2, model_dir=str(data / "job"))
    params = load_params(raw)
    model = model_def(params)
    plan = make_plan(params, model)
    cluster = ClusterConfig(
        image=image, image_pull_policy="Never", data_host_path=str(data), data_mount=str(data)
    )
    pods = [d for d in job_manifests(job_id, params, model, plan, cluster) if d["kind"] == "Pod"]
    for pod in pods:  # podman turns containerPorts into host port bindings, which collide between pods;
        for c in pod["spec"]["containers"]:  # on a cluster they only document the port
            c.pop("ports")
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(yaml.safe_dump_all(pods))
    network = f"ws-{job_id}"
    _podman("network", "create", network)
    roles = [RoleSpec(k, i) for k, i in plan.roles()]
    backend = PodmanPlayedBackend(manifest, network, roles, job_id)
    # In a cluster the coordinator and the role pods run as the same user; here the coordinator is this
    # process, so the directories it creates (checkpoints) must be writable by the pods' user.
    old_umask = os.umask(0)
    try:
        summary = JobRunner(params, backend, job_id=job_id).run()
    finally:
        os.umask(old_umask)
        backend.stop()
        _podman("network", "rm", "-f", network, check=False)
    assert summary.final_step == 3 and summary.checkpoint is not None
    rows = [json.loads(line) for line in (data / "job" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert (
        data / "job" / "checkpoint_3" / "model.safetensors.index.json"
    ).exists()  # written by MemoryX pods

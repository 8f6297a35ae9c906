"""The image really builds and the pods the Kubernetes backend generates really train, under podman.

Marked ``container``: it needs a container engine (``../shared/tools/container-setup`` provides podman
here; .ci/run runs it) and skips, saying why, where there is none. The pods are the ones ``job_manifests``
generates for a 2-worker job, with their security settings as generated: non-root, no capabilities, the
default seccomp profile, a read-only root filesystem with an ``emptyDir`` at /tmp, the role credential
read from a file, each role listening on its pod's IP only, the job's directory mounted alone. The
coordinator is the ordinary ``JobRunner`` in this process, passing the job's credential on every call.

What podman 4.3 (Debian bookworm's) cannot do, this file does in its place, the way a kubelet would, and
each adaptation says why next to it: it delivers the Secret as files, sets the pod IP that the downward API
would give, expands ``$(VAR)``, mounts a ``subPath`` of the host directory as that directory, and drops the
NetworkPolicy (podman has none: the podman network holds only this job's pods and this process) and the
``containerPort``s. Roles are addressed by pod IP instead of the headless Service's DNS names.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.appliance import TINY
from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.kubernetes.manifests import ClusterConfig, job_manifests, pod_name
from weightstream.backends.kubernetes.security import TOKEN_FILE
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan
from weightstream.training.events import JobEvent, RunningEvent
from weightstream.training.runner import JobRunner

pytestmark = [pytest.mark.container, pytest.mark.slow]  # ~80 s: builds the image
ROOT = Path(__file__).parents[3]
IMAGE = "localhost/weightstream:test"


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed: {r.stderr[-2000:]}")
    return r


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
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
    try:
        assert r.returncode == 0, f"image build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        yield IMAGE
    finally:
        # Leave nothing behind: every build leaves its build stage and cache as untagged images (~2 GB with
        # MKL in it); run after run they filled this machine's disk. Only images our Dockerfile labelled go.
        _podman("rmi", "-f", IMAGE, check=False)
        _podman("image", "prune", "-f", "--filter", "label=io.weightstream.dockerfile", check=False)


def test_image_runs_every_role_entry_point(image: str) -> None:
    out = _podman("run", "--rm", image, "--help").stdout
    for command in ("run", "serve", "plan", "memoryx", "swarmx", "worker", "activation"):
        assert command in out
    user = _podman("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip()
    assert user == "10001"  # not root


def _create_network(name: str) -> str:
    """A podman network with a /24 subnet of its own; returns the subnet's first three octets. Random,
    retried: another run may hold a subnet at the same time."""
    for _ in range(20):
        prefix = f"10.{random.randint(90, 250)}.{random.randint(0, 255)}"
        if _podman("network", "create", "--subnet", f"{prefix}.0/24", name, check=False).returncode == 0:
            return prefix
    raise AssertionError("no free subnet for a podman network")


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args and env values (podman 4.3 leaves them as they are)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)


def _as_podman_plays_it(pod: dict[str, Any], ip: str, secrets_dir: Path) -> dict[str, Any]:
    """``pod`` with what a kubelet provides done by hand (see the module docstring)."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    [c] = spec["containers"]
    c.pop("ports")  # podman binds containerPorts on the host, where they collide between pods
    env: dict[str, str] = {}
    for e in c["env"]:
        if e.get("valueFrom") == {"fieldRef": {"fieldPath": "status.podIP"}}:
            e.pop("valueFrom")  # podman 4.3 has no downward API for the pod's IP: the one --ip gives it
            e["value"] = ip
        e["value"] = env[e["name"]] = _expand(e["value"], env)
    c["args"] = [_expand(a, env) for a in c["args"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    new_volumes = [v for v in spec["volumes"] if "secret" not in v and "hostPath" not in v]
    for i, m in enumerate(c["volumeMounts"]):
        v = volumes[m["name"]]
        if "secret" in v:  # podman 4.3's kube play crashes on secret volumes: the kubelet's files, by hand
            path = secrets_dir / v["secret"]["secretName"]
        elif "hostPath" in v:  # podman 4.3 ignores subPath on a hostPath volume: mount the subdirectory
            path = Path(v["hostPath"]["path"]) / m.pop("subPath", "")
        else:
            continue
        m["name"] = f"{m['name']}-{i}"
        new_volumes.append({"name": m["name"], "hostPath": {"path": str(path), "type": "Directory"}})
    spec["volumes"] = new_volumes
    return pod


class PodmanPlayedBackend:
    """The generated pods, played by podman one pod at a time, each with its own IP on a podman network."""

    co_located = False  # pods: tensor bytes go over gRPC

    def __init__(
        self,
        manifests: Callable[[str], list[dict[str, Any]]],
        workdir: Path,
        network: str,
        prefix: str,
        roles: list[RoleSpec],
        job_id: str,
    ) -> None:
        self.manifests, self.workdir, self.network, self.prefix = manifests, workdir, network, prefix
        self.roles, self.job_id = roles, job_id
        self.played: list[Path] = []
        self.ips: dict[RoleSpec, str] = {}
        self.pods: dict[RoleSpec, dict[str, Any]] = {}
        self._stopping = False

    def _container(self, role: RoleSpec) -> str:
        return (
            f"{pod_name(self.job_id, role)}-{role.kind}"  # podman names a pod's container <pod>-<container>
        )

    def start(self, roles: list[RoleSpec], credential: str) -> None:
        docs = self.manifests(credential)
        # the Secret, materialised as the kubelet does for a secret volume: a file per key. Readable by
        # the pods' user; on a cluster the file is 0440 to the pod's fsGroup, which podman does not apply.
        secrets_dir = self.workdir / "secrets"
        for secret in (d for d in docs if d["kind"] == "Secret"):
            d = secrets_dir / secret["metadata"]["name"]
            d.mkdir(parents=True)
            d.chmod(0o755)
            for key, value in secret["stringData"].items():
                (d / key).write_text(value)
                (d / key).chmod(0o444)
        by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
        for i, role in enumerate(self.roles):
            ip = self.ips[role] = f"{self.prefix}.{10 + i}"
            pod = self.pods[role] = _as_podman_plays_it(by_name[pod_name(self.job_id, role)], ip, secrets_dir)
            path = self.workdir / f"{role.name}.yaml"
            path.write_text(yaml.safe_dump(pod))
            self.played.append(path)
            _podman("kube", "play", "--network", self.network, "--ip", ip, str(path), timeout=300)

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        """Ready when the pod's own readiness probe passes, run in its container as the kubelet would."""
        deadline = time.monotonic() + timeout_s
        out: dict[str, list[str]] = {}
        for role in self.roles:
            probe = self.pods[role]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
            while _podman("exec", self._container(role), *probe, check=False).returncode != 0:
                if self.failures() or time.monotonic() > deadline:
                    raise BackendError(f"{role.name} not ready: {'; '.join(self.failures())}")
                time.sleep(0.5)
            out.setdefault(role.kind, []).append(f"{self.ips[role]}:50051")
        return out

    def failures(self) -> list[str]:
        return list(self.dead().values())

    def dead(self) -> dict[RoleSpec, str]:
        if self._stopping:
            return {}
        dead = {}
        for role in self.roles:
            state = json.loads(_podman("inspect", self._container(role)).stdout)[0]["State"]
            if state["Status"] != "running":
                dead[role] = f"{role.name} {state['Status']} (exit code {state.get('ExitCode')})"
        return dead

    def keep_standby(self, per_kind: int) -> None:
        pass  # no spare containers: the pods are played once

    def restart(self, roles: list[RoleSpec]) -> None:
        raise BackendError(f"played pods are not replaced: {', '.join(r.name for r in roles)}")

    def retire(self, roles: list[RoleSpec]) -> None:
        raise BackendError(f"played pods are not retired: {', '.join(r.name for r in roles)}")

    def stop(self) -> None:
        self._stopping = True
        for path in self.played:
            _podman("kube", "down", str(path), timeout=120, check=False)


def test_generated_pods_train_a_two_worker_job(image: str, tmp_path: Path) -> None:
    job_id = uuid.uuid4().hex[:8]
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    data.chmod(0o777)  # the pods run as the image's non-root user
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(max_steps=3, num_csx=2, model_dir=str(data / "job"))
    params = load_params(raw)
    model = model_def(params)
    plan = make_plan(params, model)
    cluster = ClusterConfig(
        image=image,
        image_pull_policy="Never",
        data_host_path=str(data),
        data_mount=str(data),
        data_roots=(str(data / "datasets"),),
    )

    def manifests(credential: str) -> list[dict[str, Any]]:
        docs = job_manifests(job_id, params, model, plan, cluster, credential=credential)
        [secret] = [d for d in docs if d["kind"] == "Secret"]
        assert secret["stringData"]["token"] == credential  # the coordinator's, for this start
        assert [d for d in docs if d["kind"] == "NetworkPolicy"]  # generated; podman has nothing to apply it
        return docs

    network = f"ws-{job_id}"
    prefix = _create_network(network)
    roles = [RoleSpec(k, i) for k, i in plan.roles()]
    backend = PodmanPlayedBackend(manifests, tmp_path, network, prefix, roles, job_id)
    # In a cluster the coordinator and the role pods run as the same user; here the coordinator is this
    # process, so the directories it creates (checkpoints) must be writable by the pods' user.
    old_umask = os.umask(0)
    seen: dict[str, Any] = {}

    def while_running(event: JobEvent) -> None:  # look inside the pods once every role serves
        if isinstance(event, RunningEvent) and not seen:
            shard = backend._container(RoleSpec("memoryx", 0))
            seen["inspect"] = json.loads(_podman("inspect", shard).stdout)[0]
            # listening on the pod's IP only: nothing answers on the container's loopback
            seen["loopback"] = _podman(
                "exec", shard, "weightstream", "health", "--address", "127.0.0.1:50051", "--timeout", "2",
                check=False,
            ).returncode  # fmt: skip
            seen["root"] = _podman("exec", shard, "touch", "/home/weightstream/x", check=False).stderr
            seen["token"] = _podman("exec", shard, "cat", TOKEN_FILE, check=False).stdout.strip()
            seen["env"] = _podman("exec", shard, "env", check=False).stdout

    try:
        runner = JobRunner(params, backend, job_id=job_id, on_event=while_running)
        summary = runner.run()
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
    assert seen["inspect"]["HostConfig"]["ReadonlyRootfs"] is True and "Read-only file system" in seen["root"]
    assert seen["loopback"] == 1
    assert seen["token"] == runner.credential and runner.credential not in seen["env"]
    assert "WEIGHTSTREAM_TOKEN" not in seen["env"]
    # the pods saw only the job's directory (read-write) and the data root (read-only) of the volume
    assert sorted(p.name for p in data.iterdir()) == ["datasets", "job"] and not any(data.glob("datasets/*"))

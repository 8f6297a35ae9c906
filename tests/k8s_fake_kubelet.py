"""A fake kubelet for the fake API server: runs each pod's role as a local process, so that the coordinator
with the Kubernetes backend trains for real, and role pods can be deleted under it.

Each pod runs the command its manifest names (``weightstream <kind> ... --token-file``) with three changes a
laptop needs: it listens on 127.0.0.1 at a port fixed per pod name (as a pod's DNS name outlives the pod, a
replacement is reached at the same address), the token file is a local copy of the job's Secret, and a
ready file stands in for the readiness probe. The kubelet reports what a real one would: Running and Ready
once the role listens, Failed with the exit code when it exits; a pod deleted from the API loses its process
(SIGKILL), and a pod being deleted gracefully gets SIGTERM and then leaves the API.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.k8s_fake_api import FakeKubernetesAPI, running_ready
from weightstream.backends.environment import without_secrets
from weightstream.plan import Plan

NODE = "fake-node"  # the node this kubelet runs, as the scheduler names it in each pod's spec.nodeName


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeKubelet:
    def __init__(self, api: FakeKubernetesAPI, work_dir: Path, ns: str = "default") -> None:
        self.api, self.work_dir, self.ns = api, work_dir, ns
        self.procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # pod uid -> (pod name, process)
        self.ports: dict[str, int] = {}  # pod name -> port, for good
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for _, proc in self.procs.values():
            proc.kill()
            proc.wait()

    def role_addresses(self, job_id: str, plan: Plan, *_: Any) -> dict[str, list[str]]:
        """In place of the backend's DNS names: where each pod's process listens."""
        return {
            kind: [f"127.0.0.1:{self.port(f'ws-{job_id}-{kind}-{i}')}" for i in range(n)]
            for kind, n in plan.counts().items()
        }

    def port(self, pod_name: str) -> int:
        return self.ports.setdefault(pod_name, _free_port())

    # -- the loop ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(0.05):
            pods = {p["metadata"]["uid"]: p for p in self.api.pods(self.ns)}
            for uid in [u for u in self.procs if u not in pods]:  # deleted at once: gone before replaced
                _, proc = self.procs.pop(uid)
                proc.kill()
                proc.wait()
            for uid, pod in pods.items():
                name = pod["metadata"]["name"]
                try:
                    if "deletionTimestamp" in pod["metadata"]:
                        self._terminate(uid, name)
                    elif uid not in self.procs and pod["status"].get("phase") == "Pending":
                        self._spawn(uid, pod)
                    elif uid in self.procs:
                        self._report(uid, name, pod)
                except KeyError:  # the pod (or its Secret) left the API since the listing
                    pass

    def _terminate(self, uid: str, name: str) -> None:
        if (entry := self.procs.pop(uid, None)) is not None:
            entry[1].terminate()
            entry[1].wait()
        if _finalized(self.api, name, self.ns):
            self.api.finish_deletion(name, self.ns, uid)

    def _spawn(self, uid: str, pod: dict[str, Any]) -> None:
        name, [container] = pod["metadata"]["name"], pod["spec"]["containers"]
        self.api.bind_pod(name, NODE, self.ns)  # one node, this kubelet's
        secret = next(v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v)
        data = self.api.objects[("Secret", self.ns, secret)]["data"]["token"]
        token = self.work_dir / f"{name}.token"
        token.touch(mode=0o600)
        token.write_bytes(base64.b64decode(data))
        ready = self.work_dir / f"{uid}.ready.json"
        args = list(container["args"])
        args[args.index("--host") + 1] = "127.0.0.1"
        args[args.index("--port") + 1] = str(self.port(name))
        args[args.index("--bulk-port") + 1] = "0"  # every pod on one address here: a free port each
        args[args.index("--token-file") + 1] = str(token)
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env = {k: v.replace("$(POD_IP)", "127.0.0.1") for k, v in env.items()}
        cmd = [sys.executable, "-m", "weightstream.cli", *args, "--ready-file", str(ready)]
        with open(self.work_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [*cmd, "--parent-pid", str(os.getpid())],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**without_secrets(os.environ), **env},
                start_new_session=True,
            )
        self.procs[uid] = (name, proc)

    def _report(self, uid: str, name: str, pod: dict[str, Any]) -> None:
        proc, phase = self.procs[uid][1], pod["status"].get("phase")
        if (rc := proc.poll()) is not None and phase != "Failed":
            terminated = {"reason": "Error", "exitCode": rc if rc >= 0 else 128 - rc}
            status = running_ready() | {"phase": "Failed", "conditions": []}
            status["containerStatuses"][0] |= {"ready": False, "state": {"terminated": terminated}}
            self.api.set_pod_status(name, status, self.ns)
        elif rc is None and phase == "Pending" and (self.work_dir / f"{uid}.ready.json").exists():
            self.api.set_pod_status(name, running_ready(), self.ns)


def _finalized(api: FakeKubernetesAPI, name: str, ns: str) -> bool:
    """Whether the pod named ``name`` has no finalizer left holding it in the API."""
    return not next(
        (p["metadata"].get("finalizers") for p in api.pods(ns) if p["metadata"]["name"] == name), None
    )

"""The Kubernetes backend: a job's roles as pods. The only module of weightstream that imports ``kubernetes``.

It creates what ``manifests.py`` describes (the owner ConfigMap first, so the others can point at its uid;
then the role-token Secret and the NetworkPolicy, so no pod runs without them), reports placement
progress ("workers 3/4 running"), turns pod states into failures with the pod's own reason
(ImagePullBackOff, OOMKilled, Unschedulable, ...) instead of hanging, and deletes the job's objects.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.kubernetes.manifests import (
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    ClusterConfig,
    job_manifests,
    job_object_name,
    role_addresses,
)
from weightstream.backends.kubernetes.security import role_token_secret_name
from weightstream.params import Params, model_def
from weightstream.plan import make_plan

__all__ = ["KubernetesBackend", "default_api", "own_namespace", "pod_problem"]

# where the kubelet puts the namespace of a pod's service account (with its token, which the coordinator's
# pod keeps: it calls the API)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# container waiting reasons that will not fix themselves
_FATAL_WAITING = {
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


def default_api() -> client.CoreV1Api:
    """In a pod: the service account; elsewhere: the current kubeconfig context."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def own_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The namespace of the pod this process runs in, or None outside a pod."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def pod_problem(pod: Any) -> str | None:
    """Why a pod will not serve its role, or None while it is fine (pending normally, or running)."""
    status = pod.status
    for cs in status.container_statuses or []:
        if cs.state and cs.state.waiting and cs.state.waiting.reason in _FATAL_WAITING:
            return f"{cs.state.waiting.reason}: {cs.state.waiting.message or ''}".rstrip(": ")
        if cs.state and cs.state.terminated:
            t = cs.state.terminated
            return f"terminated: {t.reason or 'Error'} (exit code {t.exit_code})"
    if status.phase in ("Failed", "Succeeded"):
        return f"pod {status.phase.lower()}: {status.reason or ''} {status.message or ''}".strip()
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return f"Unschedulable: {cond.message or ''}".rstrip(": ")
    return None


def _ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or [])
    )


class KubernetesBackend:
    def __init__(
        self,
        job_id: str,
        params: Params,
        cluster: ClusterConfig,
        api: client.CoreV1Api | None = None,
        on_progress: Callable[[str], None] | None = None,
        poll_s: float = 1.0,
        networking: client.NetworkingV1Api | None = None,
    ) -> None:
        """``api`` and ``networking`` default to the in-pod service account or the current kubeconfig;
        ``networking`` defaults to the same connection as ``api``."""
        if cluster.coordinator_namespace is None and (ns := own_namespace()) is not None:
            # the job's NetworkPolicy must admit this pod even when jobs go to another namespace
            cluster = dataclasses.replace(cluster, coordinator_namespace=ns)
        self.job_id, self.params, self.cluster = job_id, params, cluster
        self.model = model_def(params)
        self.plan = make_plan(params, self.model)
        self.api = api or default_api()
        self.networking = networking or client.NetworkingV1Api(self.api.api_client)
        self.on_progress = on_progress or (lambda msg: None)
        self.poll_s = poll_s
        self._stopping = False
        self._selector = f"{LABEL_JOB}={job_id}"
        self._checked: tuple[float, list[str]] = (float("-inf"), [])  # when failures() last asked, and what

    # -- Backend -------------------------------------------------------------------------------------------
    def start(self, roles: list[RoleSpec], credential: str) -> None:
        """Create the job's objects; ``credential`` goes into the job's Secret, which every pod mounts."""
        ns = self.cluster.namespace
        try:
            owner, *_ = job_manifests(self.job_id, self.params, self.model, self.plan, self.cluster)
        except ValueError as e:  # the job's directory is not on the data volume
            raise BackendError(f"cannot place job {self.job_id} on Kubernetes: {e}") from e
        created = self._create(
            "ConfigMap", owner["metadata"]["name"], self.api.create_namespaced_config_map, owner
        )
        docs = job_manifests(
            self.job_id,
            self.params,
            self.model,
            self.plan,
            self.cluster,
            created.metadata.uid,
            credential=credential,
        )
        create = {
            "Secret": self.api.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "Service": self.api.create_namespaced_service,
        }
        wanted = {(r.kind, r.index) for r in roles}
        for doc in docs[1:]:  # in order: the Secret and NetworkPolicy before any pod
            labels = doc["metadata"]["labels"]
            if doc["kind"] in create:
                self._create(doc["kind"], doc["metadata"]["name"], create[doc["kind"]], doc)
            elif (labels[LABEL_ROLE], int(labels[LABEL_INDEX])) in wanted:
                self._create("Pod", doc["metadata"]["name"], self.api.create_namespaced_pod, doc)
        self.on_progress(f"created {len(wanted)} pods in namespace {ns}")

    def _create(self, kind: str, name: str, fn: Callable[..., Any], body: dict[str, Any]) -> Any:
        try:
            return fn(self.cluster.namespace, body)
        except ApiException as e:
            raise BackendError(
                f"cannot create {kind} {name} in {self.cluster.namespace}: {e.status} {e.reason}"
            ) from e

    def _pods(self) -> list[Any]:
        try:
            return self.api.list_namespaced_pod(self.cluster.namespace, label_selector=self._selector).items
        except ApiException as e:
            raise BackendError(f"cannot list the job's pods: {e.status} {e.reason}") from e

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            if self._stopping:
                raise BackendError("stopped while starting")
            pods = self._pods()
            problems = self._problems(pods)
            if problems:
                raise BackendError("; ".join(problems))
            counts = self.plan.counts()
            ready = {
                k: sum(1 for p in pods if p.metadata.labels.get(LABEL_ROLE) == k and _ready(p))
                for k in counts
            }
            msg = ", ".join(f"{k} {ready[k]}/{n} running" for k, n in counts.items())
            if msg != last:
                self.on_progress(msg)
                last = msg
            if all(ready[k] == n for k, n in counts.items()):
                return role_addresses(self.job_id, self.plan, self.cluster)
            if time.monotonic() > deadline:
                raise BackendError(f"pods not ready after {timeout_s:.0f}s: {msg}")
            time.sleep(self.poll_s)

    def _problems(self, pods: list[Any]) -> list[str]:
        out = []
        for p in pods:
            why = pod_problem(p)
            if why:
                role = f"{p.metadata.labels.get(LABEL_ROLE)}-{p.metadata.labels.get(LABEL_INDEX)}"
                out.append(f"{role} (pod {p.metadata.name}) {why}")
        return out

    def failures(self) -> list[str]:
        """Asked several times a second while calls are in flight; the API server is asked at most once
        per ``poll_s`` (a pod's death still shows within that)."""
        if self._stopping:
            return []
        at, found = self._checked
        if time.monotonic() - at < self.poll_s:
            return found
        try:
            found = self._problems(self._pods())
        except BackendError as e:
            found = [str(e)]
        self._checked = (time.monotonic(), found)
        return found

    def stop(self) -> None:
        """Delete the owner (the cluster's garbage collector removes the rest), then the pods, the
        Service, the credential's Secret and the NetworkPolicy themselves, so nothing is left even where
        ownerReferences are not honoured. The Secret goes after the pods that mount it."""
        self._stopping = True
        ns, name = self.cluster.namespace, job_object_name(self.job_id)
        calls = (
            lambda: self.api.delete_namespaced_config_map(name, ns, propagation_policy="Background"),
            lambda: self.api.delete_collection_namespaced_pod(ns, label_selector=self._selector),
            lambda: self.api.delete_namespaced_service(name, ns),
            lambda: self.api.delete_namespaced_secret(role_token_secret_name(name), ns),
            lambda: self.networking.delete_namespaced_network_policy(name, ns),
        )
        for fn in calls:
            try:
                fn()
            except ApiException as e:
                if e.status != 404:
                    raise BackendError(f"cleanup of job {self.job_id} failed: {e.status} {e.reason}") from e

"""The Kubernetes backend: a job's roles as pods. The only module of weightstream that imports ``kubernetes``.

It creates what ``manifests.py`` describes (the owner ConfigMap first, so the others can point at its uid;
then the role-token Secret and the NetworkPolicy, so no pod runs without them), reports placement
progress ("workers 3/4 running"), turns pod states into failures with the pod's own reason
(ImagePullBackOff, OOMKilled, Unschedulable, Evicted, ...) instead of hanging, and deletes the job's objects.

Fault recovery: a role is dead when its pod has such a problem, is being deleted, or is gone (deleted by
someone; only pods this backend created count, so a pod not created yet is never "deleted"). ``restart``
deletes a role's pod at once (grace period 0), waits until the API no longer has that name, and creates
the very manifest ``start`` created (same name, owner, Secret): the role keeps its DNS name, so its
address does not change. It needs no verb beyond create, list and delete on pods, which the chart's Role
grants.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from weightstream.backends.base import BackendError, RoleSpec, ready_file
from weightstream.backends.kubernetes.manifests import (
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    ClusterConfig,
    job_manifests,
    job_object_name,
    pod_name,
    role_addresses,
)
from weightstream.backends.kubernetes.security import role_token_secret_name
from weightstream.params import Params, model_def
from weightstream.plan import make_plan

log = logging.getLogger("weightstream.backends.kubernetes")

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
    if status.phase in ("Failed", "Succeeded") and status.reason:
        # the pod's own reason (Evicted, NodeLost, DeadlineExceeded) says more than its killed container's
        return f"pod {status.phase.lower()}: {status.reason}: {status.message or ''}".rstrip(": ")
    for cs in status.container_statuses or []:
        if cs.state and cs.state.waiting and cs.state.waiting.reason in _FATAL_WAITING:
            return f"{cs.state.waiting.reason}: {cs.state.waiting.message or ''}".rstrip(": ")
        if cs.state and cs.state.terminated:
            t = cs.state.terminated
            return f"terminated: {t.reason or 'Error'} (exit code {t.exit_code})"
    if status.phase in ("Failed", "Succeeded"):
        return f"pod {status.phase.lower()}: {status.message or ''}".rstrip(": ")
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return f"Unschedulable: {cond.message or ''}".rstrip(": ")
    return None


def _role_of(pod: Any) -> RoleSpec:
    labels = pod.metadata.labels or {}
    index = labels.get(LABEL_INDEX, "")
    return RoleSpec(labels.get(LABEL_ROLE, "?"), int(index) if index.isdigit() else -1)


def _ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or [])
    )


class KubernetesBackend:
    co_located = False  # pods: tensor bytes go over gRPC

    def __init__(
        self,
        job_id: str,
        params: Params,
        cluster: ClusterConfig,
        api: client.CoreV1Api | None = None,
        on_progress: Callable[[str], None] | None = None,
        poll_s: float = 1.0,
        networking: client.NetworkingV1Api | None = None,
        replace_timeout_s: float = 120.0,
    ) -> None:
        """``api`` and ``networking`` default to the in-pod service account or the current kubeconfig;
        ``networking`` defaults to the same connection as ``api``. ``replace_timeout_s``: how long
        ``restart`` waits for a deleted pod to leave the API (a finalizer can hold it)."""
        if cluster.coordinator_namespace is None and (ns := own_namespace()) is not None:
            # the job's NetworkPolicy must admit this pod even when jobs go to another namespace
            cluster = dataclasses.replace(cluster, coordinator_namespace=ns)
        self.job_id, self.params, self.cluster = job_id, params, cluster
        self.run_dir = Path(params.runconfig.model_dir) / "logs"  # where each role's ready file goes
        self.model = model_def(params)
        self.plan = make_plan(params, self.model)
        self.api = api or default_api()
        self.networking = networking or client.NetworkingV1Api(self.api.api_client)
        self.on_progress = on_progress or (lambda msg: None)
        self.poll_s = poll_s
        self.replace_timeout_s = replace_timeout_s
        self._stopping = False
        self._selector = f"{LABEL_JOB}={job_id}"
        # when failures()/dead() last asked the API server, and what they found (dead roles, or the error)
        self._checked: tuple[float, dict[RoleSpec, str], str | None] = (float("-inf"), {}, None)
        # each pod start() created, by name, with its manifest: what restart() creates again
        self._manifests: dict[str, dict[str, Any]] = {}
        self._roles: dict[str, RoleSpec] = {}
        self._retired: dict[str, RoleSpec] = {}  # pods deleted for good (``retire``), until ``restart``
        self._lock = threading.Lock()  # _manifests, _roles, _checked: failures() runs on other threads
        # held while restart() creates pods and while stop() sets _stopping: a replacement is either
        # created before stop() deletes the job's pods, or not at all (never one left behind)
        self._creating = threading.Lock()

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
        create: dict[str, Callable[..., Any]] = {
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
                name = doc["metadata"]["name"]
                self._create("Pod", name, self.api.create_namespaced_pod, doc)
                with self._lock:  # only now may its absence mean "deleted"
                    self._manifests[name] = doc
                    self._roles[name] = RoleSpec(labels[LABEL_ROLE], int(labels[LABEL_INDEX]))
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
            dead = self._dead(pods)
            if dead:
                raise BackendError("; ".join(dead.values()))
            with self._lock:
                retired = set(self._retired.values())
            counts = {k: n - sum(r.kind == k for r in retired) for k, n in self.plan.counts().items()}
            ready = {
                k: sum(
                    1
                    for p in pods
                    if p.metadata.labels.get(LABEL_ROLE) == k and _ready(p) and _role_of(p) not in retired
                )
                for k in counts
            }
            msg = ", ".join(f"{k} {ready[k]}/{n} running" for k, n in counts.items())
            if msg != last:
                self.on_progress(msg)
                last = msg
            if all(ready[k] == n for k, n in counts.items()):
                found = role_addresses(self.job_id, self.plan, self.cluster)
                self._record_ready([p for p in pods if _ready(p)], found)
                return {
                    k: [a for i, a in enumerate(v) if RoleSpec(k, i) not in retired] for k, v in found.items()
                }
            if time.monotonic() > deadline:
                raise BackendError(f"pods not ready after {timeout_s:.0f}s: {msg}")
            time.sleep(self.poll_s)

    def _record_ready(self, pods: list[Any], addresses: dict[str, list[str]]) -> None:
        """``model_dir/logs/<role>.ready.json`` for each of ``pods`` (roles write their own elsewhere; only
        MemoryX pods mount the job's directory): ``address``, its node (``host``), ``pod``, and ``pid`` null,
        as a container's process id means nothing outside it."""
        for pod in pods:
            role = _role_of(pod)
            ready = {"address": addresses[role.kind][role.index], "host": pod.spec.node_name or "",
                     "pid": None, "pod": pod.metadata.name}  # fmt: skip
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                ready_file(self.run_dir, role).write_text(json.dumps(ready))
            except OSError as e:
                log.warning("cannot record where %s serves: %s", role.name, e)

    def _dead(self, pods: list[Any]) -> dict[RoleSpec, str]:
        """Every role whose pod in ``pods`` cannot serve, is being deleted, or that start() or restart()
        created and ``pods`` lacks, with one line saying how, in role order."""
        with self._lock:
            roles, retired = dict(self._roles), set(self._retired)
        out: dict[RoleSpec, str] = {}
        for p in pods:
            name = p.metadata.name
            if name in retired:  # being deleted for good: the job goes on without it
                continue
            why = pod_problem(p)
            if p.metadata.deletion_timestamp is not None:  # going away, whatever it does until then
                why = f"{why}, being deleted" if why else "being deleted"
            if why:
                role = roles.get(name) or _role_of(p)
                out[role] = f"{role.name} (pod {name}) {why}"
        for name in roles.keys() - {p.metadata.name for p in pods}:
            out[roles[name]] = f"{roles[name].name} (pod {name}) deleted"
        return dict(sorted(out.items(), key=lambda item: (item[0].kind, item[0].index)))

    def _observe(self, fresh: bool = False) -> tuple[dict[RoleSpec, str], str | None]:
        """The dead roles, or the error listing the pods gave. Asked several times a second while calls
        are in flight: the API server is asked at most once per ``poll_s`` (a death still shows within it),
        unless ``fresh``."""
        with self._lock:
            at, dead, error = self._checked
        if not fresh and time.monotonic() - at < self.poll_s:
            return dead, error
        try:
            dead, error = self._dead(self._pods()), None
        except BackendError as e:
            dead, error = {}, str(e)
        with self._lock:
            self._checked = (time.monotonic(), dead, error)
        return dead, error

    def failures(self) -> list[str]:
        """One line per dead role (``dead``), or the API server's error when the pods cannot be listed."""
        if self._stopping:
            return []
        dead, error = self._observe()
        return [error] if error else list(dead.values())

    def dead(self) -> dict[RoleSpec, str]:
        """Roles whose pod failed, is being deleted or is gone. When the pods cannot be listed, no role is
        known dead (``failures`` carries the error): an API server's hiccup is no reason to replace pods.
        Listed now, not within ``poll_s``: recovery asks once per fault, and a pod deleted since the last
        listing (a step can fail within it) would pass for a role that does not answer, "hung"."""
        if self._stopping:
            return {}
        return dict(self._observe(fresh=True)[0])

    def keep_standby(self, per_kind: int) -> None:
        """Keeps no spare pod (not implemented here): ``restart`` creates a lost role's pod again under
        its own name, which the scheduler places and the kubelet starts before it serves."""

    def restart(self, roles: list[RoleSpec]) -> None:
        """Delete each role's pod at once (grace period 0: a hung role gets no time to finish), wait until
        its name has left the API (a pod cannot be created while one of that name exists), and create the
        manifest ``start`` created again. Raises BackendError when a role was never started here, when the
        API refuses, or when a pod is still there after ``replace_timeout_s``."""
        if self._stopping:
            raise BackendError("stopped: no role can be restarted")
        ns = self.cluster.namespace
        with self._lock:
            manifests = dict(self._manifests)
        names = {role: pod_name(self.job_id, role) for role in roles}
        for role, name in names.items():
            if name not in manifests:
                raise BackendError(f"cannot restart {role.name}: this backend never created pod {name}")
        for role, name in names.items():
            self.on_progress(f"replacing {role.name} (pod {name})")
            try:
                self.api.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:  # 404: already gone, which is what we want
                    raise BackendError(f"cannot delete pod {name} in {ns}: {e.status} {e.reason}") from e
        self._wait_gone(set(names.values()))
        with self._creating:
            if self._stopping:
                raise BackendError("stopped while replacing pods")
            for role, name in names.items():
                self._create("Pod", name, self.api.create_namespaced_pod, manifests[name])
                with self._lock:  # a retired role is the job's again
                    self._roles[name] = self._retired.pop(name, role)
        with self._lock:  # what failures() remembers predates the replacements
            self._checked = (float("-inf"), {}, None)

    def retire(self, roles: list[RoleSpec]) -> None:
        """Delete each role's pod for good: it is not reported dead, nor waited for, until ``restart``
        creates it again. (This backend never raises NoCapacityError: a pod the cluster has no room for
        stays Pending, and ``wait_ready`` times out on it.)"""
        ns = self.cluster.namespace
        for role in roles:
            name = pod_name(self.job_id, role)
            with self._lock:
                self._roles.pop(name, None)
                self._retired[name] = role
            try:
                self.api.delete_namespaced_pod(name, ns)
            except ApiException as e:
                if e.status != 404:
                    raise BackendError(f"cannot delete pod {name} in {ns}: {e.status} {e.reason}") from e
        with self._lock:
            self._checked = (float("-inf"), {}, None)

    def _wait_gone(self, names: set[str]) -> None:
        deadline = time.monotonic() + self.replace_timeout_s
        while True:
            left = [p for p in self._pods() if p.metadata.name in names]
            if not left:
                return
            if self._stopping:
                raise BackendError("stopped while replacing pods")
            if time.monotonic() > deadline:
                held = "; ".join(
                    f"{p.metadata.name} (finalizers: {', '.join(p.metadata.finalizers or []) or 'none'})"
                    for p in left
                )
                raise BackendError(
                    f"pods still present {self.replace_timeout_s:g}s after their deletion: {held}"
                )
            time.sleep(self.poll_s)

    def stop(self) -> None:
        """Delete the owner (the cluster's garbage collector removes the rest), then the pods, the
        Service, the credential's Secret and the NetworkPolicy themselves, so nothing is left even where
        ownerReferences are not honoured. The Secret goes after the pods that mount it."""
        with self._creating:
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

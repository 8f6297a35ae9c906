"""What the Kubernetes backend creates for a job, as plain manifests from pure functions.

Per job: one ConfigMap that owns everything else (deleting it deletes the job's other objects through
ownerReferences), the Secret holding the job's role credential, a NetworkPolicy letting the job's pods
talk only to each other and to the coordinator (``networkpolicy``), one headless Service giving every role
a stable DNS name ``<role>-<i>.ws-<job>.<namespace>.svc.cluster.local``, and one locked-down Pod per role
(``security``). Nothing here talks to a cluster, so tests and ``weightstream plan`` can inspect exactly
what would be created.

The data volume (a PVC, or a node directory) is never mounted whole: it holds the job store and every
job's directory. A MemoryX pod mounts its own job's directory (``subPath``) read-write, where it writes
checkpoints and resumes from them; an activation pod mounts each data root read-only. Workers and SwarmX
nodes hold only what arrives over gRPC and mount none of it.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from weightstream.backends.base import RoleSpec
from weightstream.backends.environment import role_env
from weightstream.backends.kubernetes.networkpolicy import LABEL_COORDINATOR, network_policy
from weightstream.backends.kubernetes.security import (
    TOKEN_FILE,
    container_security,
    pod_security,
    role_token_secret,
    security_mounts,
    security_volumes,
)
from weightstream.numerics import ModelDef
from weightstream.params import Params
from weightstream.plan import REPLICA, Plan, process_kind

__all__ = [
    "LABEL_COORDINATOR",
    "ROLE_ADDRESS_ENV",
    "ClusterConfig",
    "cpu_cores",
    "job_manifests",
    "job_object_name",
    "pod_name",
    "role_addresses",
    "volume_subpath",
]

ROLE_PORT = 50051
BULK_PORT = 50052  # a role's bulk transfers (transport/bulk.py): the network plane's tensor bytes
LABEL_JOB, LABEL_ROLE, LABEL_INDEX = "weightstream.io/job", "weightstream.io/role", "weightstream.io/index"
# A role listens on its pod's IP only; the readiness probe (`weightstream health`) finds it through this
# variable, since Kubernetes does not expand $(VAR) in a probe's command.
ROLE_ADDRESS_ENV = "WEIGHTSTREAM_ROLE_ADDRESS"
_MIB = 1 << 20
# Which roles see which part of the data volume (see the module docstring).
_JOB_DIR_ROLES = frozenset({"memoryx"})
_DATA_ROOT_ROLES = frozenset({"activation"})
_JOBS_DIR = "jobs"  # <data-dir>/jobs/<id> is a job's directory (jobs/service.py); the job store is beside it


@dataclass(frozen=True)
class ClusterConfig:
    namespace: str = "default"
    image: str = "weightstream:dev"
    image_pull_policy: str = "IfNotPresent"
    data_claim: str | None = None  # a PVC holding the service's data dir (job dirs, data roots)
    data_host_path: str | None = None  # instead of a PVC: a node directory (single-node setups, podman)
    data_mount: str = "/data"  # where pods see the volume: where the coordinator sees the same files
    # directories of training data under data_mount, mounted read-only in activation pods
    data_roots: tuple[str, ...] = ()
    worker_cpu: str = "2"
    # added to what the plan needs: the interpreter, numpy, gRPC and buffers in flight
    overhead_mib: int = 512
    # the namespace of the coordinator's pod, when it is not `namespace` (the NetworkPolicy admits it)
    coordinator_namespace: str | None = None

    def __post_init__(self) -> None:
        if not self.data_mount.startswith("/"):
            raise ValueError(f"data_mount must be an absolute path, not {self.data_mount!r}")
        if self.data_claim and self.data_host_path:
            raise ValueError("data_claim and data_host_path are alternatives: set one of them")
        if self.has_data_volume:
            for root in self.data_roots:
                sub = volume_subpath(root, self, "data_roots")
                if sub == _JOBS_DIR or sub.startswith(f"{_JOBS_DIR}/"):
                    raise ValueError(
                        f"data_roots: {root!r} is inside {self.data_mount}/{_JOBS_DIR}, where every job's "
                        "directory lives: a job's pods must not read other jobs' files"
                    )

    @property
    def has_data_volume(self) -> bool:
        return bool(self.data_claim or self.data_host_path)


def volume_subpath(path: str, cluster: ClusterConfig, field: str) -> str:
    """``path`` (absolute, strictly inside ``cluster.data_mount``) relative to the volume's root, as a
    ``subPath``. Raises ValueError naming ``field`` otherwise: mounting the volume's root would expose the
    job store and every other job's files."""
    mount = posixpath.normpath(cluster.data_mount)
    if not path.startswith("/"):
        raise ValueError(f"{field}: {path!r} must be an absolute path under the data volume's {mount}")
    rel = posixpath.relpath(posixpath.normpath(path), mount)
    if rel == "." or rel == ".." or rel.startswith("../"):
        raise ValueError(
            f"{field}: {path!r} must be a directory strictly inside the data volume's mount {mount} "
            f"(pods mount only that directory, never the whole volume)"
        )
    return rel


def cpu_cores(quantity: str) -> int:
    """Whole cores in a Kubernetes CPU quantity ("2", "1.5", "500m"), at least one: a worker's threads."""
    q = quantity.strip()
    cores = int(q[:-1]) / 1000 if q.endswith("m") else float(q)
    return max(1, int(cores))


def job_object_name(job_id: str) -> str:
    """The name of the job's owner ConfigMap and headless Service; pods are named after it."""
    return f"ws-{job_id}"


def pod_name(job_id: str, role: RoleSpec) -> str:
    return f"{job_object_name(job_id)}-{role.kind}-{role.index}"


def role_addresses(job_id: str, plan: Plan, cluster: ClusterConfig) -> dict[str, list[str]]:
    """The address of every role, by kind and index, from DNS names alone (known before any pod runs)."""
    svc = f"{job_object_name(job_id)}.{cluster.namespace}.svc.cluster.local"
    return {kind: [f"{kind}-{i}.{svc}:{ROLE_PORT}" for i in range(n)] for kind, n in plan.counts().items()}


def _memory_mib(role: RoleSpec, params: Params, model: ModelDef, plan: Plan, cluster: ClusterConfig) -> int:
    """Memory a role needs: a worker its budget (or two units and the model's largest activations), a
    MemoryX shard its weights and optimizer state (fp32: 3 copies for Adam, 2 for SGD; on disk, what it has
    in flight), others a little."""
    rc = params.runconfig
    if role.kind == "worker":
        budget = rc.worker_memory_mb or 4 * max(model.unit_bytes(u) for u in range(len(model.units))) // _MIB
        return budget + cluster.overhead_mib
    if process_kind(role.kind) == "memoryx":  # a shard or its replica: the same state
        copies = 2 if params.optimizer.optimizer_type == "sgd" else 3
        owned = sum(model.specs[n].numel * 4 for n, s in plan.tensor_shard.items() if s == role.index)
        if rc.memoryx_storage == "disk":  # files on the volume; in memory: a unit out, a gradient in, blocks
            biggest = max(model.unit_bytes(u) for u in range(len(model.units)))
            return 2 * biggest // _MIB + 64 + cluster.overhead_mib
        return copies * owned // _MIB + cluster.overhead_mib
    if role.kind == "swarmx":  # a unit per pass in flight, and the children's gradients of one unit
        biggest = max(model.unit_bytes(u) for u in range(len(model.units)))
        return (2 + len(plan.swarm[role.index].children)) * biggest // _MIB + cluster.overhead_mib
    return cluster.overhead_mib


def _labels(job_id: str, role: RoleSpec | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "weightstream", "app.kubernetes.io/component": "job", LABEL_JOB: job_id}
    if role is not None:
        out.update({LABEL_ROLE: role.kind, LABEL_INDEX: str(role.index)})
    return out


def _data_mounts(role: RoleSpec, job_dir: str | None, cluster: ClusterConfig) -> list[dict[str, Any]]:
    """The parts of the data volume ``role`` mounts, each at the path the coordinator sees it at."""
    mounts: list[dict[str, Any]] = []
    if process_kind(role.kind) in _JOB_DIR_ROLES and job_dir is not None:
        sub = volume_subpath(job_dir, cluster, "runconfig.model_dir")
        mounts.append({"name": "data", "mountPath": job_dir, "subPath": sub})
    if role.kind in _DATA_ROOT_ROLES and cluster.has_data_volume:  # no volume: nothing to mount from
        for root in cluster.data_roots:
            sub = volume_subpath(root, cluster, "data_roots")
            mounts.append(
                {"name": "data", "mountPath": posixpath.normpath(root), "subPath": sub, "readOnly": True}
            )
    return mounts


def _pod(
    job_id: str,
    role: RoleSpec,
    params: Params,
    model: ModelDef,
    plan: Plan,
    cluster: ClusterConfig,
    owner: dict[str, Any],
    job_dir: str | None,
) -> dict[str, Any]:
    mem = f"{_memory_mib(role, params, model, plan, cluster)}Mi"
    cpu = cluster.worker_cpu if role.kind == "worker" else "1"
    env: list[dict[str, Any]] = [
        # first: later values refer to it, and Kubernetes expands $(VAR) only from variables defined before
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": ROLE_ADDRESS_ENV, "value": f"$(POD_IP):{ROLE_PORT}"},
        *({"name": k, "value": v} for k, v in role_env(role.kind, cpu_cores(cluster.worker_cpu)).items()),
    ]
    object_name = job_object_name(job_id)
    data_mounts = _data_mounts(role, job_dir, cluster)
    # the pod's own IP only, gRPC and bulk transfers
    listen = [
        process_kind(role.kind),
        "--host",
        "$(POD_IP)",
        "--port",
        str(ROLE_PORT),
        "--bulk-port",
        str(BULK_PORT),
    ]
    container: dict[str, Any] = {
        "name": role.kind,
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        # the pod's own IP only (reached through the headless Service's DNS names), never 0.0.0.0
        "args": [*listen, "--token-file", TOKEN_FILE],
        "ports": [
            {"name": "grpc", "containerPort": ROLE_PORT, "protocol": "TCP"},
            {"name": "bulk", "containerPort": BULK_PORT, "protocol": "TCP"},
        ],
        "env": env,
        "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
        # the role's own Health RPC at $WEIGHTSTREAM_ROLE_ADDRESS (it answers before the job is configured,
        # and without the credential, so readiness means listening and serving gRPC)
        "readinessProbe": {
            "exec": {"command": ["weightstream", "health"]},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 24,
        },
        "securityContext": container_security(),
        "volumeMounts": [*security_mounts(), *data_mounts],
    }
    volumes = security_volumes(object_name)
    if data_mounts:
        volumes.append(
            {"name": "data", "persistentVolumeClaim": {"claimName": cluster.data_claim}}
            if cluster.data_claim
            else {"name": "data", "hostPath": {"path": cluster.data_host_path, "type": "Directory"}}
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job_id, role),
            "namespace": cluster.namespace,
            "labels": _labels(job_id, role),
            "ownerReferences": [owner],
        },
        "spec": {
            "hostname": f"{role.kind}-{role.index}",
            "subdomain": object_name,
            "restartPolicy": "Never",  # a role that dies fails the job; the coordinator reports why
            "automountServiceAccountToken": False,  # roles never call the Kubernetes API
            "enableServiceLinks": False,  # no *_SERVICE_HOST variables for the namespace's services
            "securityContext": pod_security(),
            "containers": [container],
            "volumes": volumes,
            **_apart_from_its_shard(job_id, role),
        },
    }


def _apart_from_its_shard(job_id: str, role: RoleSpec) -> dict[str, Any]:
    """A MemoryX replica is there to outlive its shard's node: the scheduler is asked to put it on
    another node than the shard's pod (preferred, not required: a one-node cluster still runs it)."""
    if role.kind != REPLICA:
        return {}
    shard = {LABEL_JOB: job_id, LABEL_ROLE: "memoryx", LABEL_INDEX: str(role.index)}
    term = {"labelSelector": {"matchLabels": shard}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
            }
        }
    }


def _job_dir(params: Params, cluster: ClusterConfig) -> str | None:
    """The job's directory (runconfig.model_dir) where pods can mount it, or None without a data volume.
    Raises ValueError naming runconfig.model_dir when it is not inside the volume."""
    if not cluster.has_data_volume:
        return None
    model_dir = str(params.runconfig.model_dir)
    volume_subpath(model_dir, cluster, "runconfig.model_dir")
    return posixpath.normpath(model_dir)


def job_manifests(
    job_id: str,
    params: Params,
    model: ModelDef,
    plan: Plan,
    cluster: ClusterConfig,
    owner_uid: str = "<uid of the job's ConfigMap, set on creation>",
    credential: str | None = None,
) -> list[dict[str, Any]]:
    """Every object of one job: the owner ConfigMap first, then the Service, the role-token Secret and
    the NetworkPolicy (before the pods: no pod ever runs without them), and the pods. ``owner_uid`` is known
    only once the owner exists; ``credential`` only when the coordinator starts the roles (without it the
    Secret holds a placeholder). Raises ValueError naming the field when the job's directory is not on
    the data volume."""
    name = job_object_name(job_id)
    job_dir = _job_dir(params, cluster)
    owner_cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": _labels(job_id)},
        "data": {
            "params.json": json.dumps(params.model_dump(mode="json")),
            "plan.json": json.dumps(plan.to_dict()),
        },
    }
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": name,
        "uid": owner_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    secret = role_token_secret(name, cluster.namespace, _labels(job_id), owner, credential)
    policy = network_policy(
        name,
        cluster.namespace,
        {LABEL_JOB: job_id},
        ROLE_PORT,
        _labels(job_id),
        owner,
        cluster.coordinator_namespace,
        BULK_PORT,
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": cluster.namespace,
            "labels": _labels(job_id),
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",  # headless: DNS names for the pods, no load balancing
            "publishNotReadyAddresses": True,  # roles resolve each other while they start
            "selector": {LABEL_JOB: job_id},
            "ports": [{"name": "grpc", "port": ROLE_PORT, "targetPort": ROLE_PORT}],
        },
    }
    roles = [RoleSpec(kind, i) for kind, i in plan.roles()]
    pods = [_pod(job_id, r, params, model, plan, cluster, owner, job_dir) for r in roles]
    return [owner_cm, service, secret, policy, *pods]

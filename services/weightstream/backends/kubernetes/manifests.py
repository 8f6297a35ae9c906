"""What the Kubernetes backend creates for a job, as plain manifests from pure functions.

Per job: one ConfigMap that owns everything else (deleting it deletes the job's pods and service through
ownerReferences), one headless Service giving every role a stable DNS name
``<role>-<i>.ws-<job>.<namespace>.svc.cluster.local``, and one Pod per role. Nothing here talks to a
cluster, so tests and ``weightstream plan`` can inspect exactly what would be created.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from weightstream.backends.base import RoleSpec
from weightstream.backends.environment import role_env
from weightstream.numerics import ModelDef
from weightstream.params import Params
from weightstream.plan import Plan

__all__ = ["ClusterConfig", "cpu_cores", "job_manifests", "job_object_name", "pod_name", "role_addresses"]

ROLE_PORT = 50051
LABEL_JOB, LABEL_ROLE, LABEL_INDEX = "weightstream.io/job", "weightstream.io/role", "weightstream.io/index"
_MIB = 1 << 20


@dataclass(frozen=True)
class ClusterConfig:
    namespace: str = "default"
    image: str = "weightstream:dev"
    image_pull_policy: str = "IfNotPresent"
    data_claim: str | None = None  # a PVC mounted at data_mount in every pod (model_dirs live there)
    data_host_path: str | None = None  # instead of a PVC: a node directory (single-node setups, podman)
    data_mount: str = "/data"  # must be where the coordinator sees the same files
    worker_cpu: str = "2"
    # added to what the plan needs: the interpreter, numpy, gRPC and buffers in flight
    overhead_mib: int = 512


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
    MemoryX shard its weights and optimizer state (fp32: 3 copies for Adam, 2 for SGD), others a little."""
    rc = params.runconfig
    if role.kind == "worker":
        budget = rc.worker_memory_mb or 4 * max(model.unit_bytes(u) for u in range(len(model.units))) // _MIB
        return budget + cluster.overhead_mib
    if role.kind == "memoryx":
        copies = 2 if params.optimizer.optimizer_type == "sgd" else 3
        owned = sum(model.specs[n].numel * 4 for n, s in plan.tensor_shard.items() if s == role.index)
        return (0 if rc.memoryx_storage == "disk" else copies * owned // _MIB) + cluster.overhead_mib
    if role.kind == "swarmx":  # a unit per pass in flight, and the children's gradients of one unit
        biggest = max(model.unit_bytes(u) for u in range(len(model.units)))
        return (2 + len(plan.swarm[role.index].children)) * biggest // _MIB + cluster.overhead_mib
    return cluster.overhead_mib


def _labels(job_id: str, role: RoleSpec | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "weightstream", "app.kubernetes.io/component": "job", LABEL_JOB: job_id}
    if role is not None:
        out.update({LABEL_ROLE: role.kind, LABEL_INDEX: str(role.index)})
    return out


def _pod(
    job_id: str,
    role: RoleSpec,
    params: Params,
    model: ModelDef,
    plan: Plan,
    cluster: ClusterConfig,
    owner: dict[str, Any],
) -> dict[str, Any]:
    mem = f"{_memory_mib(role, params, model, plan, cluster)}Mi"
    cpu = cluster.worker_cpu if role.kind == "worker" else "1"
    env = [{"name": k, "value": v} for k, v in role_env(role.kind, cpu_cores(cluster.worker_cpu)).items()]
    container: dict[str, Any] = {
        "name": role.kind,
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        "args": [role.kind, "--host", "0.0.0.0", "--port", str(ROLE_PORT)],
        "ports": [{"name": "grpc", "containerPort": ROLE_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
        # the role's own Health RPC (answers before the job is configured, so readiness means listening)
        "readinessProbe": {
            "exec": {"command": ["weightstream", "health", "--address", f"127.0.0.1:{ROLE_PORT}"]},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 24,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod: dict[str, Any] = {
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
            "subdomain": job_object_name(job_id),
            "restartPolicy": "Never",  # a role that dies fails the job; the coordinator reports why
            # the image's non-root user; fsGroup lets it write the shared data volume
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
            "containers": [container],
        },
    }
    if cluster.data_claim or cluster.data_host_path:
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": cluster.data_claim}}
            if cluster.data_claim
            else {"hostPath": {"path": cluster.data_host_path, "type": "Directory"}}
        )
        container["volumeMounts"] = [{"name": "data", "mountPath": cluster.data_mount}]
        pod["spec"]["volumes"] = [{"name": "data", **source}]
    return pod


def job_manifests(
    job_id: str,
    params: Params,
    model: ModelDef,
    plan: Plan,
    cluster: ClusterConfig,
    owner_uid: str = "<uid of the job's ConfigMap, set on creation>",
) -> list[dict[str, Any]]:
    """Every object of one job, the owner first. ``owner_uid`` is known only once the owner exists."""
    name = job_object_name(job_id)
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
        "name": job_object_name(job_id),
        "uid": owner_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job_object_name(job_id),
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
    return [owner_cm, service, *(_pod(job_id, r, params, model, plan, cluster, owner) for r in roles)]

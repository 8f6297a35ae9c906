"""The per-job NetworkPolicy: a job's role pods talk to each other and to the coordinator, nothing else.

Ingress to a role pod: its gRPC and bulk transfer ports from the job's own pods, and its gRPC port from
the coordinator (the service pod, recognised by ``LABEL_COORDINATOR``, which the Helm chart sets). Egress
from a role pod: the job's own pods' gRPC and bulk ports, and DNS so roles can resolve each other's names.
DNS is allowed to any destination on port 53 because where the cluster's resolver runs varies (a kube-dns
Service, a node-local cache on a link-local address); roles send nothing else anywhere. NetworkPolicies
are stateful, so replies to the coordinator's calls need no egress rule.

A NetworkPolicy is only enforced where the cluster runs a network plugin that implements them (Calico,
Cilium, ...); elsewhere it is accepted and ignored, and the role credential is the only gate.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LABEL_COORDINATOR", "network_policy"]

# the label the Helm chart puts on the coordinator's pod (templates/deployment.yaml)
LABEL_COORDINATOR = "weightstream.io/coordinator"


def _coordinator_peer(job_namespace: str, coordinator_namespace: str | None) -> dict[str, Any]:
    peer: dict[str, Any] = {"podSelector": {"matchLabels": {LABEL_COORDINATOR: "true"}}}
    if coordinator_namespace and coordinator_namespace != job_namespace:
        # a podSelector alone matches pods of the policy's own namespace only; this label is set on
        # every namespace by the API server (Kubernetes >= 1.22)
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": coordinator_namespace}}
    return peer


def network_policy(
    name: str,
    namespace: str,
    job_selector: dict[str, str],
    port: int,
    labels: dict[str, str],
    owner: dict[str, Any],
    coordinator_namespace: str | None = None,
    bulk_port: int | None = None,
) -> dict[str, Any]:
    """The NetworkPolicy isolating the pods that match ``job_selector`` (all of one job's roles), which
    serve gRPC on ``port`` and bulk transfers on ``bulk_port`` (transport/bulk.py; None: none).
    ``coordinator_namespace``: where the coordinator's pod runs, when that is not ``namespace``."""

    # fresh objects at every use: a shared one would come out of `weightstream plan` as a YAML anchor
    def job_pods() -> dict[str, Any]:
        return {"podSelector": {"matchLabels": dict(job_selector)}}

    def grpc_port() -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": port}]

    def role_ports() -> list[dict[str, Any]]:  # what roles of the job call each other on
        bulk = [] if bulk_port is None else [{"protocol": "TCP", "port": bulk_port}]
        return [*grpc_port(), *bulk]

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "podSelector": {"matchLabels": dict(job_selector)},
            "policyTypes": ["Ingress", "Egress"],  # both listed: what is not allowed below is denied
            "ingress": [
                {"from": [job_pods()], "ports": role_ports()},
                {"from": [_coordinator_peer(namespace, coordinator_namespace)], "ports": grpc_port()},
            ],
            "egress": [
                {"to": [job_pods()], "ports": role_ports()},
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            ],
        },
    }

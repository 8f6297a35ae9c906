"""The Kubernetes objects of a job: valid against the official schemas, and shaped as the plan says."""

from __future__ import annotations

import pytest

from tests.integration.appliance import TINY
from weightstream.backends.kubernetes.manifests import (
    LABEL_JOB,
    LABEL_ROLE,
    ClusterConfig,
    job_manifests,
    role_addresses,
)
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a test dependency: pip install -e .[test]"
)


def _manifests(n: int, **runconfig):
    raw = {k: v for k, v in TINY.items() if k != "eval_input"}
    raw["train_input"] = {**TINY["train_input"], "batch_size": 8 * n}
    params = load_params(raw, overrides={"num_csx": n, **runconfig})
    model = model_def(params)
    plan = make_plan(params, model)
    cluster = ClusterConfig(namespace="ml", image="registry.local/weightstream:1", data_claim="ws-data")
    return job_manifests(
        "j1", params, model, plan, cluster, owner_uid="0d5c5f7e-1111-2222-3333-444455556666"
    ), plan


@pytest.mark.parametrize("n", [1, 4, 16])
def test_manifests_validate_against_the_official_schemas(n: int) -> None:
    docs, plan = _manifests(n)
    version = kv.latest_version()
    for doc in docs:
        kv.validate(doc, version, strict=True)  # raises ValidationError naming the field
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == sum(plan.counts().values())
    assert sum(p["metadata"]["labels"][LABEL_ROLE] == "worker" for p in pods) == n


def test_everything_is_owned_by_the_job_configmap_and_labelled() -> None:
    docs, _ = _manifests(4)
    owner = docs[0]
    assert owner["kind"] == "ConfigMap" and "params.json" in owner["data"]
    for d in docs[1:]:
        [ref] = d["metadata"]["ownerReferences"]
        assert ref["kind"] == "ConfigMap" and ref["name"] == owner["metadata"]["name"] and ref["controller"]
        assert d["metadata"]["labels"][LABEL_JOB] == "j1"
        assert d["metadata"]["namespace"] == "ml"
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {LABEL_JOB: "j1"}


def test_resources_follow_the_plan() -> None:
    docs, _ = _manifests(2, worker_memory_mb=3000)
    workers = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["labels"][LABEL_ROLE] == "worker"]
    for w in workers:
        res = w["spec"]["containers"][0]["resources"]
        assert res["limits"]["memory"] == res["requests"]["memory"] == "3512Mi"  # budget + overhead
        assert w["spec"]["restartPolicy"] == "Never"
        assert w["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "ws-data"


def test_addresses_are_the_pods_dns_names() -> None:
    docs, plan = _manifests(4)
    addrs = role_addresses("j1", plan, ClusterConfig(namespace="ml"))
    pods = {d["spec"]["hostname"] for d in docs if d["kind"] == "Pod"}
    for kind, hosts in addrs.items():
        for i, a in enumerate(hosts):
            assert a == f"{kind}-{i}.ws-j1.ml.svc.cluster.local:50051" and f"{kind}-{i}" in pods

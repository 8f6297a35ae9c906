"""The Helm chart renders and lints cleanly with the real Helm engine; bad values are rejected by its schema;
installed (into the tests' fake API server), it creates a locked-down coordinator that the job pods'
NetworkPolicies admit.

helm-sdkpy needs Python >= 3.12, so it runs in a separate virtual environment (.ci/run creates it and sets
WEIGHTSTREAM_HELM_PYTHON); without one these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s_fake_api import FakeKubernetesAPI
from weightstream.backends.kubernetes.manifests import LABEL_COORDINATOR

ROOT = Path(__file__).parents[2]
HELM_PYTHON = os.environ.get("WEIGHTSTREAM_HELM_PYTHON")
pytestmark = pytest.mark.skipif(
    not HELM_PYTHON, reason="set WEIGHTSTREAM_HELM_PYTHON to a Python >= 3.12 with helm-sdkpy (.ci/run does)"
)


def lint(overrides: dict[str, Any] | None = None, kubeconfig: Path | None = None) -> dict[str, Any]:
    """Lint with ``overrides``; with ``kubeconfig``, install the chart into that cluster too."""
    assert HELM_PYTHON is not None
    r = subprocess.run(
        [
            HELM_PYTHON,
            str(ROOT / "tests" / "helm_lint.py"),
            str(ROOT / "helm" / "weightstream"),
            json.dumps(overrides or {}),
            *([str(kubeconfig)] if kubeconfig else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HELM_DRIVER": "memory"},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_default_values_lint_cleanly() -> None:
    result = lint()
    assert result["errors"] == 0, result


def test_non_default_values_lint_cleanly() -> None:
    result = lint(
        {
            "image": {"repository": "registry.local/ws", "tag": "1.2.3", "pullPolicy": "Always"},
            "apiToken": "s3cret",
            "userName": "nlp-team",
            "slots": 16,
            "service": {"type": "LoadBalancer", "restPort": 80, "grpcPort": 9090},
            "persistence": {"size": "500Gi", "storageClass": "fast", "accessModes": ["ReadWriteMany"]},
            "jobs": {"workerCpu": "8", "overheadMiB": 1024},
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "dataRoots": ["/data/corpora", "/data/shared/more"],
            "networkPolicy": {
                "enabled": True,
                "ingressFrom": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
                ],
            },
        }
    )
    assert result["errors"] == 0, result
    assert lint({"existingSecret": "my-token"})["errors"] == 0
    assert lint({"networkPolicy": {"enabled": False}})["errors"] == 0


# Each bad value next to a good value of the same key: the schema error must come from the bad value
# itself (helm-sdkpy's lint result carries severities and paths, not the error texts).
CASES = [
    ({"slots": 0}, {"slots": 1}),
    ({"image": {"pullPolicy": "Sometimes"}}, {"image": {"pullPolicy": "Always"}}),
    ({"persistence": {"size": "10GB"}}, {"persistence": {"size": "10Gi"}}),
    ({"service": {"type": "Ingress"}}, {"service": {"type": "NodePort"}}),
    ({"unknownKey": 1}, {}),
    ({"jobs": {"workerCpu": "two"}}, {"jobs": {"workerCpu": "500m"}}),
    # a data root is mounted in job pods: never the job directories, nothing off the data volume
    ({"dataRoots": ["/data/jobs/other"]}, {"dataRoots": ["/data/jobsets"]}),
    ({"dataRoots": ["/srv/corpora"]}, {"dataRoots": ["/data/corpora"]}),
    ({"networkPolicy": {"enabled": "yes"}}, {"networkPolicy": {"enabled": False}}),
    ({"userName": "two words"}, {"userName": "ada"}),
]


@pytest.mark.parametrize(
    ("bad", "good"),
    CASES,
    ids=[
        "slots",
        "pullPolicy",
        "size",
        "service-type",
        "unknown-key",
        "cpu",
        "data-root-in-jobs",
        "data-root-off-volume",
        "network-policy",
        "user-name",
    ],
)
def test_bad_values_are_rejected_by_the_schema(bad: dict[str, Any], good: dict[str, Any]) -> None:
    schema_error = [3, "values.yaml"]  # severity 3: an error, reported against values.yaml
    rejected = lint(bad)
    assert rejected["errors"] > 0 and schema_error in rejected["messages"], rejected
    accepted = lint(good)
    assert accepted["errors"] == 0 and schema_error not in accepted["messages"], accepted


def _install(tmp_path: Path, overrides: dict[str, Any]) -> FakeKubernetesAPI:
    api = FakeKubernetesAPI()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "test", "user": {"token": "unused"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "test"}}],
                "current-context": "fake",
            }
        )
    )
    try:
        result = lint(overrides, kubeconfig)
    except BaseException:
        api.close()
        raise
    assert result["errors"] == 0 and result["installed"] == "deployed", result
    return api


def test_installed_chart_runs_a_locked_down_coordinator_the_job_policies_admit(tmp_path: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="a test dependency: pip install -e .[test]")
    api = _install(tmp_path, {"dataRoots": ["/data/corpora"], "userName": "ada"})
    try:
        objects = {(kind, name): obj for (kind, _, name), obj in api.objects.items()}
    finally:
        api.close()
    version = kv.latest_version()
    for obj in objects.values():  # what Helm rendered and sent, against the official schemas
        kv.validate(obj, version, strict=True)
    pod = objects[("Deployment", "ws-weightstream")]["spec"]["template"]
    assert pod["metadata"]["labels"][LABEL_COORDINATOR] == "true"  # what every job's NetworkPolicy admits
    spec, [c] = pod["spec"], pod["spec"]["containers"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is True  # the coordinator calls the API; job pods do not
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]
    config = objects[("ConfigMap", "ws-weightstream")]["data"]
    assert config["WEIGHTSTREAM_DATA_ROOTS"] == "/data/corpora"  # serve --data-root, through envFrom
    assert config["WEIGHTSTREAM_USER_NAME"] == "ada"  # serve --user-name, through envFrom
    # RBAC: what the backend calls for a job's credential and isolation, and no reading of Secrets
    rules = objects[("Role", "ws-weightstream")]["rules"]
    granted = {
        (g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted[("", "secrets")] == {"create", "delete"}
    assert granted[("networking.k8s.io", "networkpolicies")] == {"create", "delete"}
    policy = objects[("NetworkPolicy", "ws-weightstream")]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert {p["port"] for p in policy["ingress"][0]["ports"]} == {8080, 50050}


def test_the_coordinators_network_policy_can_be_narrowed_or_left_out(tmp_path: Path) -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    api = _install(tmp_path, {"networkPolicy": {"enabled": True, "ingressFrom": [peer]}})
    try:
        [ingress] = api.objects[("NetworkPolicy", "default", "ws-weightstream")]["spec"]["ingress"]
        assert ingress["from"] == [peer]
    finally:
        api.close()
    api = _install(tmp_path, {"networkPolicy": {"enabled": False}})
    try:
        assert not [k for k in api.objects if k[0] == "NetworkPolicy"]
    finally:
        api.close()

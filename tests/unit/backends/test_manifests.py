"""The Kubernetes objects of a job: valid against the official schemas, shaped as the plan says, and locked
down (the credential from a Secret, a NetworkPolicy, hardened pod settings, subPath-only data)."""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pytest

from tests.params_files import TINY
from weightstream.backends.kubernetes.manifests import (
    LABEL_COORDINATOR,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_ADDRESS_ENV,
    ClusterConfig,
    job_manifests,
    role_addresses,
)
from weightstream.backends.kubernetes.security import TOKEN_FILE, TOKEN_PLACEHOLDER
from weightstream.params import load_params, model_def
from weightstream.plan import REPLICA, make_plan

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a test dependency: pip install -e .[test]"
)


CLUSTER = ClusterConfig(
    namespace="ml",
    image="registry.local/weightstream:1",
    data_claim="ws-data",
    data_roots=("/data/datasets", "/data/shared/corpora/"),
)
CREDENTIAL = "a1" * 32


def _manifests(
    n: int, cluster: ClusterConfig = CLUSTER, credential: str | None = None, **runconfig: Any
) -> tuple[list[dict[str, Any]], Any]:
    raw = {k: v for k, v in TINY.items() if k != "eval_input"}
    raw["train_input"] = {**TINY["train_input"], "batch_size": 8 * n}
    # where the service puts job j1's directory when it runs with --data-dir /data
    overrides = {"num_csx": n, "model_dir": "/data/jobs/j1", **runconfig}
    params = load_params(raw, overrides=overrides)
    model = model_def(params)
    plan = make_plan(params, model)
    docs = job_manifests(
        "j1", params, model, plan, cluster, "0d5c5f7e-1111-2222-3333-444455556666", credential=credential
    )
    return docs, plan


def _pods(docs: list[dict[str, Any]], role: str | None = None) -> list[dict[str, Any]]:
    pods = [d for d in docs if d["kind"] == "Pod"]
    return [p for p in pods if role is None or p["metadata"]["labels"][LABEL_ROLE] == role]


def _data_mounts(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's mounts of the data volume (the PVC or node directory), whatever the volume is called."""
    data = {v["name"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v or "hostPath" in v}
    return [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] in data]


@pytest.mark.parametrize("n", [1, 4, 16])
def test_manifests_validate_against_the_official_schemas(n: int) -> None:
    docs, plan = _manifests(n)
    version = kv.latest_version()
    for doc in docs:
        kv.validate(doc, version, strict=True)  # raises ValidationError naming the field
    assert [d["kind"] for d in docs[:4]] == ["ConfigMap", "Service", "Secret", "NetworkPolicy"]
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
    for shard in _pods(docs, "memoryx"):
        [data] = [v for v in shard["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert data["persistentVolumeClaim"]["claimName"] == "ws-data"


def test_a_disk_backed_shard_asks_for_what_it_has_in_flight_not_for_its_state() -> None:
    """Memory mode: three fp32 copies of what the shard owns; disk mode: two of the largest unit, however
    much the shard owns (here TINY on one shard: its state is bigger than two units)."""

    def shard_memory(**runconfig: Any) -> int:
        docs, _ = _manifests(1, num_wgt_servers=1, **runconfig)
        [shard] = _pods(docs, "memoryx")
        return int(shard["spec"]["containers"][0]["resources"]["requests"]["memory"].removesuffix("Mi"))

    model = model_def(load_params({k: v for k, v in TINY.items() if k != "eval_input"}))
    biggest = max(model.unit_bytes(u) for u in range(len(model.units)))
    overhead = CLUSTER.overhead_mib
    assert shard_memory(memoryx_storage="disk") == 2 * biggest // 2**20 + 64 + overhead
    owned = sum(s.numel * 4 for s in model.specs.values())
    assert shard_memory() == 3 * owned // 2**20 + overhead


def test_addresses_are_the_pods_dns_names() -> None:
    docs, plan = _manifests(4)
    addrs = role_addresses("j1", plan, ClusterConfig(namespace="ml"))
    pods = {d["spec"]["hostname"] for d in docs if d["kind"] == "Pod"}
    for kind, hosts in addrs.items():
        for i, a in enumerate(hosts):
            assert a == f"{kind}-{i}.ws-j1.ml.svc.cluster.local:50051" and f"{kind}-{i}" in pods


# -- the role plane's credential, network isolation, pod hardening -------------------------------------------


@pytest.mark.parametrize("n", [1, 4])
def test_every_pod_is_locked_down(n: int) -> None:
    docs, _ = _manifests(n, credential=CREDENTIAL)
    for pod in _pods(docs):
        spec, [c] = pod["spec"], pod["spec"]["containers"]
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert (
            spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
        )
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
        # a read-only root: /tmp is an emptyDir
        volumes = {v["name"]: v for v in spec["volumes"]}
        [tmp] = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in volumes[tmp["name"]] and not tmp.get("readOnly")
        # the credential: a file from the job's Secret, mounted read-only, named on the command line by path
        [token] = [m for m in c["volumeMounts"] if TOKEN_FILE.startswith(m["mountPath"] + "/")]
        assert token["readOnly"] is True
        assert volumes[token["name"]]["secret"]["secretName"] == "ws-j1-role-token"
        assert c["args"][c["args"].index("--token-file") + 1] == TOKEN_FILE
        # listening on the pod's own IP, which the readiness probe finds through the environment
        assert c["args"][c["args"].index("--host") + 1] == "$(POD_IP)"
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert c["env"][0]["name"] == "POD_IP"  # $(POD_IP) expands only from variables defined before
        assert env[ROLE_ADDRESS_ENV]["value"] == "$(POD_IP):50051"
        assert c["readinessProbe"]["exec"]["command"] == ["weightstream", "health"]


def test_no_pod_carries_a_token_in_its_environment_or_command_line() -> None:
    docs, _ = _manifests(4, credential=CREDENTIAL)
    for pod in _pods(docs):
        [c] = pod["spec"]["containers"]
        assert "WEIGHTSTREAM_TOKEN" not in {e["name"] for e in c["env"]}  # the service's API token
        assert all("valueFrom" not in e or "fieldRef" in e["valueFrom"] for e in c["env"])  # no secretKeyRef
        assert "envFrom" not in c
        assert CREDENTIAL not in json.dumps(pod)
    # the credential is in the job's Secret and nowhere else
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["stringData"] == {"token": CREDENTIAL} and secret["type"] == "Opaque"
    assert sum(json.dumps(d).count(CREDENTIAL) for d in docs) == 1


def test_without_a_credential_the_secret_holds_a_placeholder() -> None:
    docs, _ = _manifests(2)  # as `weightstream plan` makes them
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["stringData"] == {"token": TOKEN_PLACEHOLDER}
    assert secret["metadata"]["ownerReferences"][0]["name"] == "ws-j1" and secret["immutable"] is True


def test_the_data_volume_is_mounted_only_as_the_jobs_own_dir_and_read_only_data_roots() -> None:
    docs, _ = _manifests(4)
    for pod in _pods(docs):
        role = pod["metadata"]["labels"][LABEL_ROLE]
        mounts = {m["mountPath"]: m for m in _data_mounts(pod)}
        for m in mounts.values():  # never the volume's root, so never the job store (jobs.sqlite)
            assert m["subPath"] and not m["subPath"].startswith(("/", "..")), m
            assert m["mountPath"] == posixpath.join("/data", m["subPath"])  # where the coordinator sees it
        writable = {m["subPath"] for m in mounts.values() if not m.get("readOnly")}
        if role == "memoryx":  # checkpoints: this job's directory, and no other job's
            assert writable == {"jobs/j1"} and set(mounts) == {"/data/jobs/j1"}
        elif role == "activation":  # the training data, read-only
            assert writable == set()
            assert {m["subPath"] for m in mounts.values()} == {"datasets", "shared/corpora"}
        else:  # workers and SwarmX nodes hold only what arrives over gRPC
            assert mounts == {}
            assert not [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]


def test_a_node_directory_is_mounted_the_same_way() -> None:
    cluster = ClusterConfig(data_host_path="/srv/ws", data_mount="/data", data_roots=("/data/datasets",))
    docs, _ = _manifests(1, cluster)
    shard = _pods(docs, "memoryx")[0]
    [vol] = [v for v in shard["spec"]["volumes"] if "hostPath" in v]
    assert vol["hostPath"] == {"path": "/srv/ws", "type": "Directory"}
    assert [(m["mountPath"], m["subPath"]) for m in _data_mounts(shard)] == [("/data/jobs/j1", "jobs/j1")]


@pytest.mark.parametrize(
    ("roots", "msg"),
    [
        (("/data",), "strictly inside the data volume's mount /data"),  # the whole volume: the job store
        (("/data/../etc",), "strictly inside"),
        (("/srv/datasets",), "strictly inside"),
        (("datasets",), "must be an absolute path"),
        (("/data/jobs",), "where every job's directory lives"),
        (("/data/jobs/other-job",), "where every job's directory lives"),
    ],
)
def test_data_roots_that_would_expose_more_than_data_are_refused(roots: tuple[str, ...], msg: str) -> None:
    with pytest.raises(ValueError, match=rf"^data_roots: .*{msg}"):
        ClusterConfig(data_claim="ws-data", data_roots=roots)
    ClusterConfig(data_roots=roots)  # no data volume: nothing is mounted, so nothing to refuse


def test_a_job_dir_off_the_data_volume_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^runconfig\.model_dir: '/data' must be a directory strictly"):
        _manifests(1, model_dir="/data")
    with pytest.raises(ValueError, match=r"^runconfig\.model_dir: '/home/me/run' must be a directory"):
        _manifests(1, model_dir="/home/me/run")
    docs, _ = _manifests(1, ClusterConfig(), model_dir="./model_dir")  # no volume: nothing to mount
    assert all(_data_mounts(p) == [] for p in _pods(docs))


def test_the_network_policy_admits_only_the_jobs_pods_and_the_coordinator() -> None:
    """The job's pods reach each other's gRPC and bulk transfer ports; the coordinator only gRPC."""
    docs, _ = _manifests(2)
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    job_pods = {"podSelector": {"matchLabels": {LABEL_JOB: "j1"}}}
    assert spec["podSelector"] == job_pods["podSelector"] and spec["policyTypes"] == ["Ingress", "Egress"]
    assert all(p["metadata"]["labels"][LABEL_JOB] == "j1" for p in _pods(docs))  # every pod is selected
    from_pods, from_coordinator = spec["ingress"]
    coordinator = {"podSelector": {"matchLabels": {LABEL_COORDINATOR: "true"}}}
    role_ports = [{"protocol": "TCP", "port": 50051}, {"protocol": "TCP", "port": 50052}]
    assert from_pods == {"from": [job_pods], "ports": role_ports}
    assert from_coordinator == {"from": [coordinator], "ports": [{"protocol": "TCP", "port": 50051}]}
    for pod in _pods(docs):  # each role serves its bulk transfers on the port the policy opens
        [c] = pod["spec"]["containers"]
        assert c["args"][c["args"].index("--bulk-port") + 1] == "50052"
        assert {"name": "bulk", "containerPort": 50052, "protocol": "TCP"} in c["ports"]
    to_pods, dns = spec["egress"]
    assert to_pods == {"to": [job_pods], "ports": role_ports}
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}
    assert policy["metadata"]["ownerReferences"][0]["name"] == "ws-j1"


def test_a_coordinator_in_another_namespace_is_admitted_by_namespace() -> None:
    cluster = ClusterConfig(namespace="ml", coordinator_namespace="weightstream")
    docs, _ = _manifests(1, cluster, model_dir="./model_dir")
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    kv.validate(policy, kv.latest_version(), strict=True)
    [coordinator] = policy["spec"]["ingress"][1]["from"]
    assert coordinator == {
        "podSelector": {"matchLabels": {LABEL_COORDINATOR: "true"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "weightstream"}},
    }


def test_without_a_data_volume_no_pod_mounts_one_and_every_manifest_is_valid() -> None:
    """No claim and no node directory: the data roots (set by default) are mounted nowhere, and no pod
    declares a data volume with nothing behind it (a hostPath of path null, which the API server
    rejects)."""
    cluster = ClusterConfig(data_roots=("/data/datasets",))
    docs, _ = _manifests(2, cluster)
    version = kv.latest_version()
    for doc in docs:
        kv.validate(doc, version, strict=True)
    for pod in _pods(docs):
        assert _data_mounts(pod) == []
        volumes = pod["spec"]["volumes"]
        assert not [v for v in volumes if "hostPath" in v or "persistentVolumeClaim" in v]
        mounted = {m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounted <= {v["name"] for v in pod["spec"]["volumes"]}  # every mount has its volume


def test_a_replica_is_a_memoryx_pod_asked_to_run_apart_from_its_shard() -> None:
    docs, plan = _manifests(2, memoryx_replicas=1, num_wgt_servers=2)
    version = kv.latest_version()
    for doc in docs:
        kv.validate(doc, version, strict=True)
    replicas = _pods(docs, REPLICA)
    assert len(replicas) == plan.counts()[REPLICA] == 2
    for i, pod in enumerate(replicas):
        container = pod["spec"]["containers"][0]
        assert container["args"][0] == "memoryx"  # the MemoryX command: a replica is a MemoryX process
        assert container["resources"] == _pods(docs, "memoryx")[i]["spec"]["containers"][0]["resources"]
        (term,) = pod["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector == {LABEL_JOB: "j1", LABEL_ROLE: "memoryx", LABEL_INDEX: str(i)}
    assert all("affinity" not in p["spec"] for p in _pods(docs) if p not in replicas)

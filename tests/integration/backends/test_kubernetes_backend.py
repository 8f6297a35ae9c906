"""The Kubernetes backend against a fake API server speaking the real HTTP API, with the real client."""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
from pathlib import Path

import pytest

from tests.integration.appliance import TINY
from tests.k8s_fake_api import FakeKubernetesAPI, container_status, running_ready
from tests.waiting import wait_until
from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.kubernetes.manifests import ClusterConfig
from weightstream.params import load_params
from weightstream.plan import make_plan

kubernetes = pytest.importorskip(
    "kubernetes", reason="the kubernetes client is a dependency: pip install -e ."
)
from weightstream.backends.kubernetes.backend import KubernetesBackend, own_namespace  # noqa: E402

CREDENTIAL = "5e" * 32  # a role token as the coordinator makes them: 64 hex digits


def _backend(
    fake: FakeKubernetesAPI, progress: list[str], cluster: ClusterConfig | None = None, **overrides: object
) -> tuple[KubernetesBackend, list[RoleSpec]]:
    params = load_params(TINY, overrides={"num_csx": 2, **overrides})
    cfg = kubernetes.client.Configuration(host=fake.url)
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    backend = KubernetesBackend(
        "job1", params, cluster or ClusterConfig(), api=api, on_progress=progress.append, poll_s=0.05
    )
    plan = make_plan(params)
    roles = [RoleSpec(k, i) for k, i in plan.roles()]
    return backend, roles


def test_creates_owned_objects_reports_placement_and_cleans_up(fake: FakeKubernetesAPI) -> None:
    progress: list[str] = []
    backend, roles = _backend(fake, progress)
    backend.start(roles, CREDENTIAL)
    owner = fake.objects[("ConfigMap", "default", "ws-job1")]
    pods = fake.pods()
    assert len(pods) == len(roles) == 6
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"] for p in pods)

    def kubelet() -> None:  # pods become ready one by one, each seen by the backend before the next
        for p in pods:
            seen = len(progress)
            fake.set_pod_status(p["metadata"]["name"], running_ready())
            seen_more = functools.partial(lambda n: len(progress) > n, seen)
            wait_until(seen_more, f"the backend to see {p['metadata']['name']} ready", 10)

    t = threading.Thread(target=kubelet)
    t.start()
    addresses = backend.wait_ready(timeout_s=10)
    t.join()
    assert addresses["worker"] == [f"worker-{i}.ws-job1.default.svc.cluster.local:50051" for i in range(2)]
    assert any("worker 1/2 running" in m for m in progress) and "worker 2/2 running" in progress[-1]
    assert backend.failures() == []
    backend.stop()
    assert fake.objects == {}  # owner, secret, network policy, service and pods are gone


def test_the_credential_reaches_the_pods_through_the_jobs_secret_only(fake: FakeKubernetesAPI) -> None:
    backend, roles = _backend(fake, [])
    backend.start(roles, CREDENTIAL)
    [secret] = fake.of_kind("Secret")
    assert secret["metadata"]["name"] == "ws-job1-role-token" and secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["token"]).decode() == CREDENTIAL
    owner = fake.objects[("ConfigMap", "default", "ws-job1")]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    for pod in fake.pods():
        [c] = pod["spec"]["containers"]
        assert "--token-file" in c["args"] and CREDENTIAL not in json.dumps(pod)
        [vol] = [v for v in pod["spec"]["volumes"] if "secret" in v]
        assert vol["secret"]["secretName"] == "ws-job1-role-token"
    # the Secret and the NetworkPolicy exist before the first pod is created
    posts = [path.rsplit("/", 1)[-1] for method, path in fake.requests if method == "POST"]
    first_pod = posts.index("pods")
    assert posts.index("secrets") < first_pod and posts.index("networkpolicies") < first_pod
    [policy] = fake.of_kind("NetworkPolicy")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"weightstream.io/job": "job1"}}
    backend.stop()
    deleted = {path for method, path in fake.requests if method == "DELETE"}
    assert "/api/v1/namespaces/default/secrets/ws-job1-role-token" in deleted
    assert "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/ws-job1" in deleted
    assert fake.objects == {}


def test_a_job_dir_off_the_data_volume_is_refused_before_anything_is_created(
    fake: FakeKubernetesAPI, tmp_path: Path
) -> None:
    cluster = ClusterConfig(data_claim="ws-data")  # mounted at /data
    backend, roles = _backend(fake, [], cluster, model_dir=str(tmp_path / "job1"))
    with pytest.raises(BackendError, match=r"runconfig\.model_dir: .* strictly inside .* /data"):
        backend.start(roles, CREDENTIAL)
    assert fake.objects == {}


def test_the_coordinators_namespace_is_read_from_its_service_account(tmp_path: Path) -> None:
    assert own_namespace(tmp_path / "absent") is None  # not in a pod
    (tmp_path / "namespace").write_text("weightstream-system\n")
    assert own_namespace(tmp_path / "namespace") == "weightstream-system"


@pytest.mark.parametrize(
    "status,reason",
    [
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    container_status({"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}})
                ],
            },
            "ImagePullBackOff",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    container_status({"terminated": {"reason": "OOMKilled", "exitCode": 137}})
                ],
            },
            "OOMKilled",
        ),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes have enough memory",
                    }
                ],
            },
            "Unschedulable",
        ),
        (  # the kubelet evicted it: the pod's reason, not its killed container's, says why
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "containerStatuses": [
                    container_status({"terminated": {"reason": "ContainerStatusUnknown", "exitCode": 137}})
                ],
            },
            "pod failed: Evicted: The node was low on resource: memory.",
        ),
    ],
)
def test_pod_failures_fail_fast_with_the_pods_reason(
    fake: FakeKubernetesAPI, status: dict, reason: str
) -> None:
    backend, roles = _backend(fake, [])
    backend.start(roles, CREDENTIAL)
    fake.set_pod_status("ws-job1-worker-1", status)
    t0 = time.monotonic()
    with pytest.raises(BackendError) as e:
        backend.wait_ready(timeout_s=30)
    assert time.monotonic() - t0 < 5, "a pod that cannot run must not make the job wait for the timeout"
    assert "worker-1" in str(e.value) and reason in str(e.value)
    for p in fake.pods():  # and once running, a dead pod is a failure naming it
        fake.set_pod_status(p["metadata"]["name"], running_ready())
    fake.set_pod_status("ws-job1-memoryx-0", status)
    assert any("memoryx-0" in f and reason in f for f in backend.failures())
    backend.stop()
    assert fake.objects == {}


def test_api_errors_are_clear(fake: FakeKubernetesAPI) -> None:
    backend, roles = _backend(fake, [])
    backend.start(roles, CREDENTIAL)
    with pytest.raises(BackendError, match="cannot create ConfigMap ws-job1 in default: 409"):
        backend.start(roles, CREDENTIAL)  # the same job twice
    backend.stop()
    backend.stop()  # idempotent: everything is already gone

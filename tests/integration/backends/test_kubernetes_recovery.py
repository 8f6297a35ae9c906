"""Fault recovery on Kubernetes against the fake API server with the real client: which roles are dead
(deleted, being deleted, evicted, failed) and how ``restart`` replaces a role's pod with the same one."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.appliance import TINY
from tests.k8s_fake_api import FakeKubernetesAPI, running_ready
from tests.waiting import wait_until
from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.kubernetes.manifests import ClusterConfig
from weightstream.params import load_params
from weightstream.plan import make_plan

kubernetes = pytest.importorskip(
    "kubernetes", reason="the kubernetes client is a dependency: pip install -e ."
)
from weightstream.backends.kubernetes.backend import KubernetesBackend  # noqa: E402

CREDENTIAL = "5e" * 32
RBAC = Path(__file__).parents[3] / "helm" / "weightstream" / "templates" / "rbac.yaml"
WORKER_1 = RoleSpec("worker", 1)
POD = "ws-job1-worker-1"


def _backend(
    fake: FakeKubernetesAPI, progress: list[str] | None = None, replace_timeout_s: float = 10.0
) -> tuple[KubernetesBackend, list[RoleSpec]]:
    params = load_params(TINY, overrides={"num_csx": 2})
    cfg = kubernetes.client.Configuration(host=fake.url)
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    backend = KubernetesBackend(
        "job1",
        params,
        ClusterConfig(),
        api=api,
        on_progress=(progress if progress is not None else []).append,
        poll_s=0.02,
        replace_timeout_s=replace_timeout_s,
    )
    return backend, [RoleSpec(k, i) for k, i in make_plan(params).roles()]


def _running(fake: FakeKubernetesAPI) -> None:
    for p in fake.pods():
        fake.set_pod_status(p["metadata"]["name"], running_ready())


def _started(fake: FakeKubernetesAPI, progress: list[str] | None = None, **kw: Any) -> KubernetesBackend:
    """A backend whose job's pods all run."""
    backend, roles = _backend(fake, progress, **kw)
    backend.start(roles, CREDENTIAL)
    _running(fake)
    backend.wait_ready(timeout_s=5)
    return backend


def _fresh(backend: KubernetesBackend) -> dict[RoleSpec, str]:
    time.sleep(0.05)  # past poll_s: dead() asks the API server again
    return backend.dead()


def _identity(pod: dict[str, Any]) -> dict[str, Any]:
    """What a replacement must share with the pod it replaces."""
    meta = pod["metadata"]
    return {k: meta[k] for k in ("name", "namespace", "labels", "ownerReferences")} | {"spec": pod["spec"]}


def test_nothing_is_dead_before_start_while_pending_or_after_stop(fake: FakeKubernetesAPI) -> None:
    backend, roles = _backend(fake)
    assert backend.dead() == {} and backend.failures() == []  # no pod exists: none has been deleted
    backend.start(roles, CREDENTIAL)
    assert _fresh(backend) == {}  # created, pending: not dead
    backend.stop()
    assert _fresh(backend) == {} and backend.failures() == []  # stop() deleted them: not dead either


def test_pods_a_failed_start_never_created_are_not_dead(fake: FakeKubernetesAPI) -> None:
    backend, roles = _backend(fake)
    # someone else's pod holds swarmx-0's name: start() stops there, before activation-0 and the workers
    fake.handle("POST", "pods", "default", None, {}, {"metadata": {"name": "ws-job1-swarmx-0"}})
    with pytest.raises(BackendError, match="cannot create Pod ws-job1-swarmx-0 in default: 409"):
        backend.start(roles, CREDENTIAL)
    assert {p["metadata"]["name"] for p in fake.pods()} == {f"ws-job1-{r.name}" for r in roles[:3]}
    assert _fresh(backend) == {}
    fake.delete_pod("ws-job1-memoryx-1", grace_s=0)  # but one it did create and that vanished is
    assert list(_fresh(backend)) == [RoleSpec("memoryx", 1)]
    backend.stop()


def test_a_deleted_a_terminating_and_an_evicted_pod_are_dead(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    fake.delete_pod(POD, grace_s=0)  # kubectl delete --force
    fake.delete_pod("ws-job1-memoryx-0")  # kubectl delete: the pod stays while its grace period runs
    fake.set_pod_status(
        "ws-job1-activation-0",
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    )
    dead = _fresh(backend)
    assert dead == {
        RoleSpec("activation", 0): (
            "activation-0 (pod ws-job1-activation-0) pod failed: Evicted: "
            "The node was low on resource: memory."
        ),
        RoleSpec("memoryx", 0): "memoryx-0 (pod ws-job1-memoryx-0) being deleted",
        WORKER_1: f"worker-1 (pod {POD}) deleted",
    }
    assert backend.failures() == list(dead.values())
    backend.stop()
    assert backend.dead() == {} and backend.failures() == []


def test_failures_ask_the_api_server_at_most_once_per_poll(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    backend.poll_s = 0.5
    fake.delete_pod(POD, grace_s=0)
    backend.dead()
    lists = len(fake.requests)
    for _ in range(20):
        assert backend.failures() == [f"worker-1 (pod {POD}) deleted"]
    assert len(fake.requests) == lists
    backend.stop()


def test_recovery_sees_a_deletion_the_last_poll_did_not(fake: FakeKubernetesAPI) -> None:
    """``dead`` (recovery's question, once per fault) lists the pods now: a pod deleted within ``poll_s``
    of the last listing is dead, being deleted, not a live role that does not answer (otherwise a step that
    fails within 0.1 s of a ``kubectl delete`` reports memoryx-0 as hung)."""
    backend = _started(fake)
    backend.poll_s = 60.0
    assert backend.failures() == []  # listed: nothing dead, kept for a minute
    fake.delete_pod("ws-job1-memoryx-0")  # kubectl delete: SIGTERM, the pod stays for its grace period
    assert backend.failures() == []  # the cached listing
    assert backend.dead() == {RoleSpec("memoryx", 0): "memoryx-0 (pod ws-job1-memoryx-0) being deleted"}
    backend.stop()


def test_restart_recreates_a_deleted_pod_as_it_was(fake: FakeKubernetesAPI) -> None:
    progress: list[str] = []
    backend = _started(fake, progress)
    addresses = backend.wait_ready(timeout_s=5)
    before = fake.objects[("Pod", "default", POD)]
    fake.delete_pod(POD, grace_s=0)
    assert list(_fresh(backend)) == [WORKER_1]
    backend.restart([WORKER_1])
    after = fake.objects[("Pod", "default", POD)]
    assert _identity(after) == _identity(before)  # same name, labels, owner, spec (the Secret's volume)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    [vol] = [v for v in after["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "ws-job1-role-token"
    assert f"replacing worker-1 (pod {POD})" in progress
    assert backend.dead() == {}  # pending again, and not the "deleted" seen before the restart
    fake.set_pod_status(POD, running_ready())
    assert backend.wait_ready(timeout_s=5) == addresses  # DNS names: a replacement keeps its address
    assert _fresh(backend) == {}
    backend.stop()
    assert fake.objects == {}


def test_a_retired_pod_is_not_dead_nor_waited_for_until_it_is_restarted(fake: FakeKubernetesAPI) -> None:
    """``retire`` (the job goes on without worker-1, training/elastic.py): its pod is deleted, never reported
    dead, and ``wait_ready`` gives every other role; ``restart`` makes it the job's again."""
    backend = _started(fake)
    full = backend.wait_ready(timeout_s=5)
    backend.retire([WORKER_1])
    pod = fake.objects.get(("Pod", "default", POD))
    assert pod is None or pod["metadata"].get("deletionTimestamp")  # deleted, or going with its grace period
    assert _fresh(backend) == {} and backend.failures() == []
    assert backend.wait_ready(timeout_s=5) == {**full, "worker": full["worker"][:1]}
    backend.restart([WORKER_1])
    assert fake.objects[("Pod", "default", POD)]["status"]["phase"] == "Pending"
    fake.delete_pod(POD, grace_s=0)
    assert list(_fresh(backend)) == [WORKER_1]  # the job's again: its loss is a fault
    backend.restart([WORKER_1])
    fake.set_pod_status(POD, running_ready())
    assert backend.wait_ready(timeout_s=5) == full
    backend.stop()
    assert fake.objects == {}


def test_restart_deletes_a_pod_still_there_at_once_first(fake: FakeKubernetesAPI) -> None:
    # a short timeout: deleting with the pod's own grace period (30s) would keep it there and fail this
    backend = _started(fake, replace_timeout_s=1.0)
    uid = fake.objects[("Pod", "default", POD)]["metadata"]["uid"]
    seen = len(fake.requests)
    backend.restart([WORKER_1])  # a hung role: its pod runs, and the coordinator gave up on it
    path = f"/api/v1/namespaces/default/pods/{POD}"
    calls = [r for r in fake.requests[seen:] if r[1] in (path, "/api/v1/namespaces/default/pods")]
    assert calls[0] == ("DELETE", path) and calls[-1] == ("POST", "/api/v1/namespaces/default/pods")
    assert fake.objects[("Pod", "default", POD)]["metadata"]["uid"] != uid
    assert fake.objects[("Pod", "default", POD)]["status"]["phase"] == "Pending"
    backend.stop()


def _restart_held_pod(
    backend: KubernetesBackend, fake: FakeKubernetesAPI
) -> tuple[threading.Thread, list[BaseException]]:
    """``restart`` of worker-1, whose pod a finalizer holds, in a thread; returns once the pod is marked
    for deletion (the restart then waits for it to go). Errors land in the list, not lost in the thread."""
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            backend.restart([WORKER_1])
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=restart)
    t.start()
    wait_until(
        lambda: "deletionTimestamp" in fake.objects[("Pod", "default", POD)]["metadata"],
        f"the restart to mark {POD} for deletion",
    )
    return t, errors


def _pod_lists(fake: FakeKubernetesAPI) -> int:
    """How many times the job's pods have been listed (what a backend waiting for a pod to go does)."""
    return sum(1 for method, path in list(fake.requests) if method == "GET" and path.endswith("/pods"))


def test_restart_waits_for_a_pod_held_by_a_finalizer(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    uid = fake.objects[("Pod", "default", POD)]["metadata"]["uid"]
    fake.set_pod_finalizers(POD, ["example.com/hold"])
    t, errors = _restart_held_pod(backend, fake)
    lists = _pod_lists(fake)
    # the restart looks again, finds the pod still there, and keeps waiting rather than creating its own
    wait_until(lambda: _pod_lists(fake) >= lists + 2, "the restart to look for the held pod twice more")
    assert t.is_alive() and fake.objects[("Pod", "default", POD)]["metadata"]["uid"] == uid
    assert _fresh(backend) == {WORKER_1: f"worker-1 (pod {POD}) being deleted"}
    fake.finish_deletion(POD)
    t.join(timeout=5)
    assert not t.is_alive() and errors == []
    assert fake.objects[("Pod", "default", POD)]["metadata"]["uid"] != uid
    backend.stop()


def test_restart_gives_up_on_a_pod_that_does_not_go(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake, replace_timeout_s=0.3)
    fake.set_pod_finalizers(POD, ["example.com/hold"])
    with pytest.raises(
        BackendError, match=rf"still present 0.3s after .*{POD} \(finalizers: example.com/hold\)"
    ):
        backend.restart([WORKER_1])
    backend.stop()


def test_a_replacement_that_cannot_run_fails_wait_ready_naming_it(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    backend.restart([WORKER_1])
    crash = running_ready() | {"phase": "Running", "conditions": []}
    crash["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}
    }
    fake.set_pod_status(POD, crash)
    with pytest.raises(BackendError, match=rf"worker-1 \(pod {POD}\) CrashLoopBackOff: back-off"):
        backend.wait_ready(timeout_s=5)
    backend.stop()


def test_restart_refuses_roles_it_never_started_and_after_stop(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    with pytest.raises(BackendError, match="cannot restart worker-7: this backend never created pod"):
        backend.restart([RoleSpec("worker", 7)])
    backend.stop()
    with pytest.raises(BackendError, match="stopped"):
        backend.restart([WORKER_1])
    assert fake.objects == {}


def test_the_charts_role_grants_every_verb_the_backend_uses(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    fake.delete_pod(POD, grace_s=0)
    _fresh(backend)
    backend.restart([WORKER_1, RoleSpec("memoryx", 0)])
    backend.stop()
    used: set[tuple[str, str, str]] = set()
    for method, path in fake.requests:  # /api/v1/namespaces/<ns>/<resource>[/<name>]
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        resource, named = parts[parts.index("namespaces") + 2], len(parts) > parts.index("namespaces") + 3
        verb = {"POST": "create", "GET": "get" if named else "list"}.get(method)
        used.add((group, resource, verb or ("delete" if named else "deletecollection")))
    # the rules are plain YAML (only the metadata is templated), so no Helm engine is needed to read them
    role = RBAC.read_text().split("---")[0]
    rules = yaml.safe_load(role[role.index("rules:") :])["rules"]
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert used <= granted, f"the backend calls what the chart's Role does not grant: {used - granted}"
    assert ("", "pods", "delete") in used and ("", "pods", "list") in used


def test_a_restart_that_stop_overtakes_leaves_no_pod_behind(fake: FakeKubernetesAPI) -> None:
    backend = _started(fake)
    fake.set_pod_finalizers(POD, ["example.com/hold"])
    t, errors = _restart_held_pod(backend, fake)
    backend.stop()  # the service shuts down while restart() waits for the old pod to go
    t.join(timeout=5)
    assert not t.is_alive() and [str(e) for e in errors] == ["stopped while replacing pods"]
    assert fake.objects == {}


@pytest.mark.parametrize(
    "role,grace_s",
    [
        # kubectl delete --force: the process is killed, the pod gone at once (~11 s: with the slow tests)
        pytest.param(WORKER_1, 0, marks=pytest.mark.slow),
        # kubectl delete: SIGTERM, then the pod goes (the shard's state too); ~12 s: with the slow tests
        pytest.param(RoleSpec("memoryx", 0), None, marks=pytest.mark.slow),
    ],
)
def test_a_job_on_the_fake_cluster_survives_a_deleted_pod(
    fake: FakeKubernetesAPI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    role: RoleSpec,
    grace_s: int | None,
) -> None:
    """The coordinator, the Kubernetes backend and real role processes (the fake kubelet's): a role's
    pod deleted mid-run is replaced under the same name, and the job goes on to its last step."""
    from tests.k8s_fake_kubelet import FakeKubelet
    from weightstream.backends.kubernetes import backend as backend_module
    from weightstream.training.events import JobEvent, RestartEvent, StepEvent
    from weightstream.training.runner import JobRunner

    kubelet = FakeKubelet(fake, tmp_path)
    monkeypatch.setattr(backend_module, "role_addresses", kubelet.role_addresses)
    params = load_params(
        TINY,
        overrides={"num_csx": 2, "max_steps": 30, "model_dir": str(tmp_path / "job"), "rpc_timeout_s": 20.0},
    )
    cfg = kubernetes.client.Configuration(host=fake.url)
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    progress: list[str] = []
    backend = KubernetesBackend(
        "job1", params, ClusterConfig(), api=api, on_progress=progress.append, poll_s=0.1
    )
    events: list[JobEvent] = []
    deleted = threading.Event()
    deleted_at: list[float] = []

    def on_event(event: JobEvent) -> None:
        events.append(event)
        if isinstance(event, StepEvent) and event.record.step == 10 and not deleted.is_set():
            deleted.set()
            deleted_at.append(time.time())
            fake.delete_pod(f"ws-job1-{role.name}", grace_s=grace_s)

    try:
        summary = JobRunner(params, backend, on_event=on_event, job_id="job1").run()
    finally:
        backend.stop()
        kubelet.close()
    assert summary.final_step == 30 and deleted.is_set()
    assert f"replacing {role.name} (pod ws-job1-{role.name})" in progress
    [restart] = [e for e in events if isinstance(e, RestartEvent)]
    assert restart.role == role.name and restart.reason.endswith("deleted")  # or "being deleted"
    assert restart.host == "fake-node"  # from the role's ready file, which the coordinator writes here
    addresses = kubelet.role_addresses("job1", make_plan(params))
    for kind, n in make_plan(params).counts().items():  # a ready file per role
        for i in range(n):
            ready = json.loads((tmp_path / "job" / "logs" / f"{kind}-{i}.ready.json").read_text())
            pod = f"ws-job1-{kind}-{i}"
            assert ready == {"address": addresses[kind][i], "host": "fake-node", "pid": None, "pod": pod}
    rewritten = (tmp_path / "job" / "logs" / f"{role.name}.ready.json").stat().st_mtime
    assert rewritten > deleted_at[0]  # written again once the replacement was ready
    assert fake.objects == {}

"""A small fake of the Kubernetes API server: real HTTP on loopback, the routes its clients use.

Stores the kinds the Kubernetes backend and the Helm chart create (``_RESOURCES``) per namespace, assigns
uids, turns a Secret's ``stringData`` into base64 ``data`` as the API server does, filters by label
selector, emulates the garbage collector (deleting an owner deletes what points at it), deletes pods
gracefully as the API server does (see ``_delete_pod``), and lets a test set a pod's status or finish its
deletion the way a kubelet would. It answers discovery (``/version``, ``/api``, ``/apis``) too, so
Helm can install the chart into it. The real ``kubernetes`` client and the real Helm engine talk to it,
so requests and responses are real (JSON only: Helm must keep its release records in memory,
``HELM_DRIVER=memory``, as its typed Secret client would speak protobuf).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

# group/version -> resource -> kind ("v1" is the core group, served under /api/v1)
_RESOURCES = {
    "v1": {
        "configmaps": "ConfigMap",
        "secrets": "Secret",
        "services": "Service",
        "pods": "Pod",
        "serviceaccounts": "ServiceAccount",
        "persistentvolumeclaims": "PersistentVolumeClaim",
    },
    "apps/v1": {"deployments": "Deployment"},
    "rbac.authorization.k8s.io/v1": {"roles": "Role", "rolebindings": "RoleBinding"},
    "networking.k8s.io/v1": {"networkpolicies": "NetworkPolicy"},
}
_KINDS = {plural: kind for resources in _RESOURCES.values() for plural, kind in resources.items()}
_GROUP_VERSION = {plural: gv for gv, resources in _RESOURCES.items() for plural in resources}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/v1)/namespaces/(?P<ns>[^/]+)/(?P<kind>[a-z]+)(?:/(?P<name>[^/]+))?$"
)


class FakeKubernetesAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> object
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                api.requests.append((method, url.path))
                if (found := _discovery(url.path)) is not None:
                    return self._reply(200, found)
                m = _PATH.match(url.path)
                gv = f"{m['group']}/v1" if m and m["group"] else "v1"
                if m is None or _GROUP_VERSION.get(m["kind"]) != gv:
                    return self._reply(404, _status(404, "NotFound", f"no route {url.path}"))
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, out = api.handle(method, m["kind"], m["ns"], m["name"], query, body)
                self._reply(code, out)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the API -------------------------------------------------------------------------------------------
    def handle(
        self,
        method: str,
        kind: str,
        ns: str,
        name: str | None,
        query: dict[str, str],
        body: dict[str, Any] | None,
    ) -> tuple[int, dict[str, Any]]:
        k = _KINDS[kind]
        with self.lock:
            if method == "POST":
                assert body is not None
                key = (k, ns, body["metadata"]["name"])
                if key in self.objects:
                    return 409, _status(409, "AlreadyExists", f"{kind} {key[2]} already exists")
                obj = json.loads(json.dumps(body))
                obj["metadata"].update(uid=str(uuid.uuid4()), namespace=ns, resourceVersion="1")
                if k == "Pod":
                    obj["status"] = {"phase": "Pending", "conditions": []}
                if k == "Secret":  # stored and returned as base64 data only
                    data = obj.setdefault("data", {})
                    for field, value in obj.pop("stringData", {}).items():
                        data[field] = base64.b64encode(value.encode()).decode()
                self.objects[key] = obj
                return 201, obj
            if method == "GET" and name is None:
                items = [
                    o
                    for (kk, n, _), o in self.objects.items()
                    if kk == k and n == ns and _matches(o, query.get("labelSelector"))
                ]
                return 200, {"kind": f"{k}List", "apiVersion": "v1", "metadata": {}, "items": items}
            if method == "GET":
                obj = self.objects.get((k, ns, name or ""))
                return (200, obj) if obj else (404, _status(404, "NotFound", f"{kind} {name} not found"))
            if method == "DELETE" and name is None:
                gone = [
                    key
                    for key, o in self.objects.items()
                    if key[0] == k and key[1] == ns and _matches(o, query.get("labelSelector"))
                ]
                items = [self.objects.pop(key) for key in gone]
                return 200, {"kind": f"{k}List", "apiVersion": "v1", "metadata": {}, "items": items}
            if k == "Pod" and (pod := self.objects.get((k, ns, name or ""))) is not None:
                grace = query.get("gracePeriodSeconds") or (body or {}).get("gracePeriodSeconds")
                return 200, self._delete_pod(ns, pod, None if grace is None else int(grace))
            obj = self.objects.pop((k, ns, name or ""), None)
            if obj is None:
                return 404, _status(404, "NotFound", f"{kind} {name} not found")
            self._collect_garbage(obj)
            return 200, _status(200, "Success", "deleted")

    def _delete_pod(self, ns: str, pod: dict[str, Any], grace: int | None) -> dict[str, Any]:
        """As the API server: a pod goes at once with grace period 0 or once it has finished (Failed,
        Succeeded); otherwise, and while it has finalizers, it stays with ``deletionTimestamp`` set
        until ``finish_deletion`` (its kubelet's part). Returns the pod, as the API server does."""
        meta = pod["metadata"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        if pod.get("status", {}).get("phase") in ("Failed", "Succeeded"):
            grace = 0
        meta.setdefault("deletionTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["deletionGracePeriodSeconds"] = grace
        if grace == 0 and not meta.get("finalizers"):
            self.objects.pop(("Pod", ns, meta["name"]))
            self._collect_garbage(pod)
        return pod

    def _collect_garbage(self, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]  # the garbage collector: dependents go with their owner
        for key in [
            key
            for key, o in self.objects.items()
            if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences", []))
        ]:
            self.objects.pop(key)

    # -- what a kubelet or scheduler would do ----------------------------------------------------------------
    def set_pod_status(self, name: str, status: dict[str, Any], ns: str = "default") -> None:
        with self.lock:
            self.objects[("Pod", ns, name)]["status"] = status

    def bind_pod(self, name: str, node: str, ns: str = "default") -> None:
        """What the scheduler does: the pod runs on ``node`` (``spec.nodeName``)."""
        with self.lock:
            self.objects[("Pod", ns, name)]["spec"]["nodeName"] = node

    def set_pod_finalizers(self, name: str, finalizers: list[str], ns: str = "default") -> None:
        """What a controller holding a pod does: its deletion then waits for ``finish_deletion``."""
        with self.lock:
            self.objects[("Pod", ns, name)]["metadata"]["finalizers"] = finalizers

    def delete_pod(self, name: str, grace_s: int | None = None, ns: str = "default") -> None:
        """What ``kubectl delete pod`` (or a drain's eviction) asks of the API server."""
        with self.lock:
            self._delete_pod(ns, self.objects[("Pod", ns, name)], grace_s)

    def finish_deletion(self, name: str, ns: str = "default", uid: str | None = None) -> None:
        """The kubelet has stopped the pod's containers and its controllers let go: the pod leaves. With
        ``uid``, only that pod (a kubelet's delete has a uid precondition: never a new pod of that name)."""
        with self.lock:
            pod = self.objects[("Pod", ns, name)]
            if uid is None or pod["metadata"]["uid"] == uid:
                self.objects.pop(("Pod", ns, name))
                self._collect_garbage(pod)

    def pods(self, ns: str = "default") -> list[dict[str, Any]]:
        return self.of_kind("Pod", ns)

    def of_kind(self, kind: str, ns: str = "default") -> list[dict[str, Any]]:
        with self.lock:
            return [o for (k, n, _), o in self.objects.items() if k == kind and n == ns]


def container_status(state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    """The status of a pod's one container, as a kubelet reports it, in ``state``."""
    return {"name": "c", "ready": ready, "restartCount": 0, "image": "i", "imageID": "", "state": state}


def running_ready() -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [container_status({"running": {}}, ready=True)],
    }


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in (part.split("=", 1) for part in selector.split(",")))


def _discovery(path: str) -> dict[str, Any] | None:
    """What the API server says about itself at ``path``, or None when ``path`` is not discovery."""
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = [
            {
                "name": gv.split("/")[0],
                "versions": [{"groupVersion": gv, "version": "v1"}],
                "preferredVersion": {"groupVersion": gv, "version": "v1"},
            }
            for gv in _RESOURCES
            if gv != "v1"
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    gv = path.removeprefix("/api/").removeprefix("/apis/")
    if gv not in _RESOURCES or path not in (f"/api/{gv}", f"/apis/{gv}"):
        return None
    verbs = ["create", "delete", "deletecollection", "get", "list"]
    resources = [
        {"name": plural, "singularName": "", "namespaced": True, "kind": kind, "verbs": verbs}
        for plural, kind in _RESOURCES[gv].items()
    ]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "reason": reason,
        "message": message,
        "code": code,
    }

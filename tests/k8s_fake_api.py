"""A small fake of the Kubernetes API server: real HTTP on loopback, the routes the backend uses.

Stores ConfigMaps, Services and Pods per namespace, assigns uids, filters by label selector, emulates the
garbage collector (deleting an owner deletes what points at it), and lets a test set a pod's status the
way a kubelet would. The real ``kubernetes`` client talks to it, so requests and responses are real.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_PATH = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|pods)(?:/(?P<name>[^/]+))?$"
)
_KINDS = {"configmaps": "ConfigMap", "services": "Service", "pods": "Pod"}


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
                m = _PATH.match(url.path)
                if m is None:
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
            obj = self.objects.pop((k, ns, name or ""), None)
            if obj is None:
                return 404, _status(404, "NotFound", f"{kind} {name} not found")
            uid = obj["metadata"]["uid"]  # the garbage collector: dependents go with their owner
            for key in [
                key
                for key, o in self.objects.items()
                if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences", []))
            ]:
                self.objects.pop(key)
            return 200, _status(200, "Success", "deleted")

    # -- what a kubelet or scheduler would do ----------------------------------------------------------------
    def set_pod_status(self, name: str, status: dict[str, Any], ns: str = "default") -> None:
        with self.lock:
            self.objects[("Pod", ns, name)]["status"] = status

    def pods(self, ns: str = "default") -> list[dict[str, Any]]:
        with self.lock:
            return [o for (k, n, _), o in self.objects.items() if k == "Pod" and n == ns]


def running_ready() -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "c",
                "ready": True,
                "restartCount": 0,
                "image": "i",
                "imageID": "",
                "state": {"running": {}},
            }
        ],
    }


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in (part.split("=", 1) for part in selector.split(",")))


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

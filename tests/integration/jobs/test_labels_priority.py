"""Changing a job's labels and priority over both APIs, served for real on loopback: REST
(``PATCH /v1/jobs/{id}/labels``, ``PUT /v1/jobs/{id}/priority``) and gRPC (``SetJobLabels``,
``SetJobPriority``) reach the same service methods, with the same limits as a submission and the same
errors (unknown job, bad label, finished job), and a new priority reorders the queue."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.fleet import Fleet
from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import TOKEN, LiveApi
from tests.waiting import wait_until
from weightstream.jobs.limits import MAX_LABEL_LENGTH, MAX_LABELS
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc

AUTH = (("authorization", f"Bearer {TOKEN}"),)


class Api:
    """The service over ``Fleet`` runners (a job named ``name`` blocks until finished), its REST and its
    gRPC API; one slot, so a running blocker keeps every other job queued."""

    def __init__(self, live: LiveApi, fleet: Fleet) -> None:
        self.live, self.fleet, self.service = live, fleet, live.service
        self.http = live.http()
        self.channel = grpc.insecure_channel(live.grpc_address)
        self.stub = rpc.CoordinatorStub(self.channel)

    def submit(self, name: str, priority: int = 2) -> str:
        return self.service.submit(copy.deepcopy(TINY), 1, {"name": name}, priority).id

    def blocked(self) -> None:
        """The slot taken by a job that runs until the test ends."""
        self.submit("blocker")
        wait_until(
            lambda: "blocker" in self.fleet.started, lambda: f"the blocker to start ({self.fleet.started})"
        )

    def finished(self) -> str:
        self.fleet.instant.add("done")
        job = self.submit("done")
        wait_until(lambda: self.service.is_terminal(job), lambda: "the job to finish")
        return job

    def queue(self) -> list[str]:
        return [j.id for j in self.service.store.queue()]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    fleet = Fleet()
    with LiveApi(tmp_path / "data", slots=1, runners=fleet, grpc=True) as live:
        a = Api(live, fleet)
        try:
            yield a
        finally:
            a.http.close()
            a.channel.close()
            for runner in fleet.runners.values():
                runner.finish()


def _error(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    return body


# -- REST ---------------------------------------------------------------------------------------------------
def test_rest_sets_and_removes_labels_and_answers_the_job(api: Api) -> None:
    done = api.finished()  # finished jobs can be labelled too
    job = api.submit("x")
    r = api.http.patch(f"/v1/jobs/{job}/labels", json={"set": {"team": "nlp", "run": "7"}})
    assert r.status_code == 200 and r.json()["labels"] == {"name": "x", "team": "nlp", "run": "7"}
    r = api.http.patch(f"/v1/jobs/{job}/labels", json={"set": {"run": "8"}, "remove": ["team", "absent"]})
    assert r.status_code == 200 and r.json()["labels"] == {"name": "x", "run": "8"}
    assert api.service.store.get(job).labels == {"name": "x", "run": "8"}
    r = api.http.patch(f"/v1/jobs/{done}/labels", json={"set": {"kept": "yes"}})
    assert r.status_code == 200 and r.json()["labels"]["kept"] == "yes"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"set": {"k" * (MAX_LABEL_LENGTH + 1): "v"}}, "body.set"),  # the schema's bound
        ({"set": {"k": "v" * (MAX_LABEL_LENGTH + 1)}}, "body.set"),
        ({"set": {"": "v"}}, "body.set"),
        ({"remove": "team"}, "body.remove"),
        ({"labels": {"a": "b"}}, "body.labels"),  # no such field
        ({"set": {"a": "b"}, "remove": ["a"]}, "remove"),  # the service's rules
        ({"set": {f"k{i}": "v" for i in range(MAX_LABELS)}}, "set"),  # with "name": one too many
    ],
)
def test_rest_refuses_a_bad_label_change_with_a_422_naming_the_field(
    api: Api, body: dict[str, Any], where: str
) -> None:
    job = api.submit("x")
    r = api.http.patch(f"/v1/jobs/{job}/labels", json=body)
    assert r.status_code == 422, r.text
    err = _error(r)
    assert err["code"] == "invalid_request" and any(d["path"].startswith(where) for d in err["details"]), err
    assert api.service.store.get(job).labels == {"name": "x"}  # nothing changed


def test_rest_priority_reorders_the_queue_and_a_finished_job_is_a_409(api: Api) -> None:
    done = api.finished()
    api.blocked()
    a, b = api.submit("a"), api.submit("b")
    assert api.queue() == [a, b]
    r = api.http.put(f"/v1/jobs/{b}/priority", json={"priority": 1})
    assert r.status_code == 200 and r.json()["priority"] == 1 and r.json()["id"] == b
    assert api.queue() == [b, a]
    running = api.service.store.list(status="running")[0].id  # a running job takes a priority too
    assert api.http.put(f"/v1/jobs/{running}/priority", json={"priority": 3}).status_code == 200
    r = api.http.put(f"/v1/jobs/{done}/priority", json={"priority": 1})
    assert r.status_code == 409 and _error(r)["code"] == "conflict" and "has finished" in _error(r)["message"]
    for bad in ({"priority": 0}, {"priority": 4}, {"priority": 1.5}, {}, {"priority": 1, "x": 1}):
        r = api.http.put(f"/v1/jobs/{a}/priority", json=bad)
        assert r.status_code == 422 and _error(r)["code"] == "invalid_request", (bad, r.text)
    assert api.service.store.get(a).priority == 2


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "labels", {"set": {"a": "b"}}),
        ("PUT", "priority", {"priority": 1}),
        ("GET", "logs/export", None),
    ],
)
def test_rest_an_unknown_job_is_a_404(api: Api, method: str, path: str, body: dict[str, Any] | None) -> None:
    r = api.http.request(method, f"/v1/jobs/nope/{path}", json=body)
    assert r.status_code == 404 and _error(r) == {"code": "not_found", "message": "no job 'nope'"}


def test_rest_new_routes_are_in_the_openapi_document(api: Api) -> None:
    paths = httpx.get(f"{api.live.url}/openapi.json").json()["paths"]
    assert "patch" in paths["/v1/jobs/{job_id}/labels"] and "put" in paths["/v1/jobs/{job_id}/priority"]
    export = paths["/v1/jobs/{job_id}/logs/export"]["get"]["responses"]
    assert "application/gzip" in export["200"]["content"] and "404" in export
    job = paths["/v1/jobs/{job_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    view = httpx.get(f"{api.live.url}/openapi.json").json()["components"]["schemas"][
        job["$ref"].split("/")[-1]
    ]
    assert {"user", "duration_s"} <= set(view["required"])


# -- gRPC ---------------------------------------------------------------------------------------------------
def test_grpc_sets_labels_and_priority(api: Api) -> None:
    api.blocked()
    a, b = api.submit("a"), api.submit("b")
    reply = api.stub.SetJobLabels(
        pb.SetJobLabelsRequest(job_id=a, set={"team": "nlp"}, remove=["absent"]), metadata=AUTH, timeout=10
    )
    assert json.loads(reply.job_json)["labels"] == {"name": "a", "team": "nlp"}
    reply = api.stub.SetJobLabels(
        pb.SetJobLabelsRequest(job_id=a, remove=["team"]), metadata=AUTH, timeout=10
    )
    assert json.loads(reply.job_json)["labels"] == {"name": "a"}
    reply = api.stub.SetJobPriority(pb.SetJobPriorityRequest(job_id=b, priority=1), metadata=AUTH, timeout=10)
    assert json.loads(reply.job_json)["priority"] == 1 and api.queue() == [b, a]


def _code(call: Any, request: Any, metadata: Any = AUTH) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call(request, metadata=metadata, timeout=10)
    return e.value.code(), e.value.details() or ""


def test_grpc_errors_map_as_the_rest_ones(api: Api) -> None:
    done = api.finished()
    api.blocked()
    queued = api.submit("q")
    set_labels, set_priority = api.stub.SetJobLabels, api.stub.SetJobPriority
    code, details = _code(set_labels, pb.SetJobLabelsRequest(job_id="nope", set={"a": "b"}))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    code, _ = _code(set_priority, pb.SetJobPriorityRequest(job_id="nope", priority=1))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = _code(set_labels, pb.SetJobLabelsRequest(job_id=queued, set={"k" * 300: "v"}))
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT and "set.kkk" in details and str(MAX_LABEL_LENGTH) in details
    )
    code, details = _code(set_labels, pb.SetJobLabelsRequest(job_id=queued, set={"a": "1"}, remove=["a"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "both set and removed" in details
    many = {f"k{i}": "v" for i in range(MAX_LABELS)}
    code, details = _code(set_labels, pb.SetJobLabelsRequest(job_id=queued, set=many))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"it would have {MAX_LABELS + 1}" in details
    for priority in (0, 4, -1000):
        code, details = _code(set_priority, pb.SetJobPriorityRequest(job_id=queued, priority=priority))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "must be 1, 2 or 3" in details
    code, details = _code(set_priority, pb.SetJobPriorityRequest(job_id=done, priority=1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "has finished" in details
    bad_token = (("authorization", "Bearer wrong"),)
    code, _ = _code(set_priority, pb.SetJobPriorityRequest(job_id=queued, priority=1), bad_token)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = _code(set_labels, pb.SetJobLabelsRequest(job_id=queued, set={"a": "b"}), bad_token)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    job = api.service.store.get(queued)
    assert job.labels == {"name": "q"} and job.priority == 2  # no refused change left a trace

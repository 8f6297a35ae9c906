"""Schemathesis over the REST API's own OpenAPI document, with the valid token, on a real server.

Every operation gets examples generated from its schema, half of them aimed at things that exist (a job
that has run, its checkpoint, a file of it; a submit with params that validate), so both the 404s and the
real answers are checked: no 5xx, and every response as documented (status code, content type, body,
headers). Not "schema-valid data is accepted": a params object can match the JSON schema and still fail
the params validation, with a documented 422. The default run is small and deterministic; the slow one
is larger and random.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import TOKEN, LiveApi

schemathesis = pytest.importorskip("schemathesis", reason="a test dependency: pip install -e .[test]")
from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the skip: schemathesis brings it
from hypothesis import strategies as st  # noqa: E402
from schemathesis import checks  # noqa: E402

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveApi]:
    # slots as many as num_csx may ask for: a generated submit with valid params runs (at once, no roles)
    with LiveApi(tmp_path / "data", slots=1024) as api:
        yield api


# every operation must be fuzzed: one missing from the document (a route left out of the app) fails here
OPERATIONS = {
    "PATCH /v1/jobs/{job_id}/labels",
    "PUT /v1/jobs/{job_id}/priority",
    "GET /v1/jobs/{job_id}/logs/export",
    "DELETE /v1/jobs/{job_id}",
    "POST /v1/jobs",
}
# bodies the service accepts, beside the generated ones (mostly 422s): their answers are checked too
VALID_BODIES = {
    "POST /v1/jobs": {"params": copy.deepcopy(TINY), "num_csx": 1, "labels": {"by": "fuzz"}, "priority": 2},
    "PATCH /v1/jobs/{job_id}/labels": {"set": {"by": "fuzz"}, "remove": ["made_by"]},
    "PUT /v1/jobs/{job_id}/priority": {"priority": 1},  # the job has finished: a documented 409
}


def fuzz(live: LiveApi, examples: int, derandomize: bool) -> None:
    job = live.finished_job()
    existing = {"job_id": job.id, "step": 1, "name": "model.safetensors"}
    schema = schemathesis.openapi.from_dict(httpx.get(f"{live.url}/openapi.json").json())
    headers = {"Authorization": f"Bearer {TOKEN}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert len(operations) >= 13 and labels >= OPERATIONS, sorted(labels)
    for operation in operations:
        # the job alone, the job and its step, everything: each level's 404 and the answer at the end
        names = [n for n in existing if f"{{{n}}}" in operation.path]
        strategies = [operation.as_strategy()] + [
            operation.as_strategy(path_parameters={n: existing[n] for n in names[:k]})
            for k in range(1, len(names) + 1)
        ]
        valid = VALID_BODIES.get(f"{operation.method.upper()} {operation.path}")
        if valid is not None:
            path_parameters = {n: existing[n] for n in names}
            strategies.append(operation.as_strategy(body=valid, path_parameters=path_parameters))

        @given(case=st.one_of(strategies))
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=derandomize,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(base_url=live.url, headers=headers, checks=CHECKS, timeout=30)

        check()


def test_openapi_fuzzing_finds_no_server_error_and_no_schema_violation(live: LiveApi) -> None:
    fuzz(live, examples=20, derandomize=True)


@pytest.mark.slow
def test_openapi_fuzzing_at_length(live: LiveApi) -> None:
    fuzz(live, examples=200, derandomize=False)

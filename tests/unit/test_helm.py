"""The Helm chart renders and lints cleanly with the real Helm engine; bad values are rejected by its schema.

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

ROOT = Path(__file__).parents[2]
HELM_PYTHON = os.environ.get("WEIGHTSTREAM_HELM_PYTHON")
pytestmark = pytest.mark.skipif(
    not HELM_PYTHON, reason="set WEIGHTSTREAM_HELM_PYTHON to a Python >= 3.12 with helm-sdkpy (.ci/run does)"
)


def lint(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    assert HELM_PYTHON is not None
    r = subprocess.run(
        [
            HELM_PYTHON,
            str(ROOT / "tests" / "helm_lint.py"),
            str(ROOT / "helm" / "weightstream"),
            json.dumps(overrides or {}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
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
            "slots": 16,
            "service": {"type": "LoadBalancer", "restPort": 80, "grpcPort": 9090},
            "persistence": {"size": "500Gi", "storageClass": "fast", "accessModes": ["ReadWriteMany"]},
            "jobs": {"workerCpu": "8", "overheadMiB": 1024},
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        }
    )
    assert result["errors"] == 0, result
    assert lint({"existingSecret": "my-token"})["errors"] == 0


# Each bad value next to a good value of the same key: the schema error must come from the bad value
# itself (helm-sdkpy's lint result carries severities and paths, not the error texts).
CASES = [
    ({"slots": 0}, {"slots": 1}),
    ({"image": {"pullPolicy": "Sometimes"}}, {"image": {"pullPolicy": "Always"}}),
    ({"persistence": {"size": "10GB"}}, {"persistence": {"size": "10Gi"}}),
    ({"service": {"type": "Ingress"}}, {"service": {"type": "NodePort"}}),
    ({"unknownKey": 1}, {}),
    ({"jobs": {"workerCpu": "two"}}, {"jobs": {"workerCpu": "500m"}}),
]


@pytest.mark.parametrize(
    ("bad", "good"), CASES, ids=["slots", "pullPolicy", "size", "service-type", "unknown-key", "cpu"]
)
def test_bad_values_are_rejected_by_the_schema(bad: dict[str, Any], good: dict[str, Any]) -> None:
    schema_error = [3, "values.yaml"]  # severity 3: an error, reported against values.yaml
    rejected = lint(bad)
    assert rejected["errors"] > 0 and schema_error in rejected["messages"], rejected
    accepted = lint(good)
    assert accepted["errors"] == 0 and schema_error not in accepted["messages"], accepted

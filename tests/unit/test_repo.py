"""The repository's own rules read from its files: CI runs the README's test command, one module imports
kubernetes, module sizes, ``create_app`` only assembles, the work-diary pattern, per-test timeouts. The rules
that run tools (ruff, import-linter, the protobuf generator, git) are in tests/integration/test_repo.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.work_diary import DIARY, diary_lines

ROOT = Path(__file__).parents[2]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install -e ./client -e ".[test]" && python -m pytest'
    assert command in readme, "the README's test command changed: update .ci/run and this test"
    assert any(line.strip() == command for line in ci.splitlines()), ".ci/run must run the README's command"


def test_only_one_module_imports_kubernetes() -> None:
    """The cluster API stays behind one narrow door (the Kubernetes backend)."""
    pattern = re.compile(r"^\s*(import kubernetes|from kubernetes\b)", re.MULTILINE)
    importers = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "services").rglob("*.py") if pattern.search(p.read_text())
    )
    assert importers == ["services/weightstream/backends/kubernetes/backend.py"]


def test_kubernetes_is_an_optional_extra_that_the_image_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in project["dependencies"]}
    assert "kubernetes" not in core
    assert any(d.startswith("kubernetes") for d in project["optional-dependencies"]["kubernetes"])
    assert '".[kubernetes]"' in (ROOT / "Dockerfile").read_text()


def test_no_hand_written_module_over_400_lines() -> None:
    generated = ROOT / "services" / "weightstream" / "proto"
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "services").rglob("*.py")
        if generated not in p.parents and (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


def test_create_app_only_assembles() -> None:
    """The REST app is assembled from routers, not written inside one closure."""
    import ast

    tree = ast.parse((ROOT / "services" / "weightstream" / "jobs" / "api" / "app.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_app")
    assert fn.end_lineno is not None and fn.end_lineno - fn.lineno < 60


def test_the_pattern_finds_a_diary_and_spares_sessions_that_are_not_one(tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    # the diary's words and numbers apart, so that this file does not match
    note.write_text(f"the session {2} streams\nthe requests.Session of the client\nfixed in Issue #{7}\n")
    assert [line.rsplit(":", 2)[-2] for line in diary_lines([note])] == ["1", "3"]
    assert DIARY.search("sessions " + "21-23") and DIARY.search("issue " + "12's target")
    assert not DIARY.search("a session of its own (setsid)") and not DIARY.search("the issues listed")


def test_every_test_runs_under_a_timeout(pytestconfig: pytest.Config) -> None:
    # pytest-timeout: a test that hangs fails with its stacks, long before CI's own limit ends the run
    assert 0 < float(pytestconfig.getini("timeout")) <= 900

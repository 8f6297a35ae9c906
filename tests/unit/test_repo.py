"""The repository's own rules: lint and format are clean (ruff is a test dependency)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_is_clean(args: list[str]) -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e .[test]")
    r = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install -e ./client -e ".[test]" && python -m pytest'
    assert command in readme, "the README's test command changed: update .ci/run and this test"
    assert any(line.strip() == command for line in ci.splitlines()), ".ci/run must run the README's command"


def test_generated_protobuf_code_is_up_to_date() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a test dependency: pip install -e .[test]")
    r = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_client_is_light() -> None:
    """The client distribution must not pull numpy or any server code into a user's process."""
    code = (
        "import sys, weightstream_client, weightstream_client.cli; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'weightstream', 'grpc', 'fastapi')]; "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    deps = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in deps}
    assert names == {"httpx", "pyyaml", "typer", "rich"}


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


def test_import_layers() -> None:
    """The import-linter contracts in pyproject.toml (numerics pure, roles apart from the coordinator,
    one door to kubernetes, jobs over training over backends)."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed: pip install -e .[test]")
    r = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


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

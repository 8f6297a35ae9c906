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


# A work diary in the product ("as of session N", "issue N's target") names nothing a reader can look up:
# code, tests and docs say what is and why; the history is git's. Built from parts so that this file, which
# the check reads too, does not match it.
DIARY = re.compile(r"\bsession" + r"s? [0-9]|\bissue" + r"s? #?[0-9]+", re.IGNORECASE)
DIARY_FREE = ("services", "client", "bench", "tests", "testbed", "scripts", "docs", "README.md")


def diary_lines(paths: list[Path]) -> list[str]:
    """``path:line: text`` of each line under ``paths`` (files, or folders searched whole) that ``DIARY``
    matches; binary files and caches are skipped."""
    found = []
    for top in paths:
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if DIARY.search(line):
                    where = path.relative_to(ROOT) if ROOT in path.parents else path
                    found.append(f"{where}:{number}: {line.strip()[:120]}")
    return found


def test_the_pattern_finds_a_diary_and_spares_sessions_that_are_not_one(tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    # the diary's words and numbers apart, so that this file does not match
    note.write_text(f"the session {2} streams\nthe requests.Session of the client\nfixed in Issue #{7}\n")
    assert [line.rsplit(":", 2)[-2] for line in diary_lines([note])] == ["1", "3"]
    assert DIARY.search("sessions " + "21-23") and DIARY.search("issue " + "12's target")
    assert not DIARY.search("a session of its own (setsid)") and not DIARY.search("the issues listed")


def test_no_work_diary_in_code_tests_or_docs() -> None:
    # the project's own files (tracked, or new and not ignored): build outputs such as the egg-info's copy
    # of an older README are not the product's text
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *DIARY_FREE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = diary_lines([ROOT / name for name in listed if (ROOT / name).is_file()])
    assert not found, "say what the code does and why, not when it was done:\n" + "\n".join(found)


def test_every_test_runs_under_a_timeout(pytestconfig: pytest.Config) -> None:
    # pytest-timeout: a test that hangs fails with its stacks, long before CI's own limit ends the run
    assert 0 < float(pytestconfig.getini("timeout")) <= 900

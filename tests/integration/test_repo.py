"""The repository's rules that run tools: ruff lint and format, the generated protobuf code, the client's
imports, the import-linter layers, and no work diary in the files git tracks. The rules read from files
alone are in tests/unit/test_repo.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.work_diary import DIARY_FREE, diary_lines

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_is_clean(args: list[str]) -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e .[test]")
    r = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


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

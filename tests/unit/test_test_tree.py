"""The test tree's own rules, read from its files with ``ast``: unit tests mirror the packages of
services/weightstream; a test module is imported by no other file (what tests share lives in a helper
module under tests/ or in a ``conftest.py``); a unit test reaches nothing of tests/integration (whose
helpers start processes), not even through a helper."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
UNIT = TESTS / "unit"
PACKAGE = ROOT / "services" / "weightstream"

# Folders of tests/unit that mirror no package of services/weightstream: the repository's own scripts
FOLDERS_OF_THE_REPOSITORY = {
    "bench": "bench/'s scripts, whose functions are tested without running them",
    "testbed": "testbed/, the emulated hosts",
}
# Test modules at the top of tests/unit that are not named after a top-level module of
# services/weightstream (test_<module>.py): rules of the repository, or a concept across packages
TOP_LEVEL_TESTS = {
    "test_architecture_diagram.py": "docs/architecture.svg against scripts/render_architecture.py",
    "test_cli_help.py": "the --help of both CLIs (weightstream and the client's wsctl)",
    "test_examples.py": "the shipped example params files",
    "test_hf_bin.py": "pytorch_model.bin as a starting checkpoint (hf_checkpoint.py, memoryx, training)",
    "test_import_cycles.py": "no import circles among weightstream's modules",
    "test_interrupted_message.py": "what `weightstream run` says on Ctrl-C (console.py)",
    "test_key_report_view.py": "the key report validate and run print (config_cli.py)",
    "test_modelzoo_configs_script.py": "scripts/modelzoo_configs.py",
    "test_performance_page.py": "docs/gen/performance_page.py",
    "test_progress_refresh.py": "the progress bars of the server's and the client's commands",
    "test_readme.py": "README.md",
    "test_reference_pages.py": "docs/gen's reference pages",
    "test_repo.py": "the repository's own rules",
    "test_role_closed.py": "a role closed mid-call, across every role kind",
    "test_test_tree.py": "the test tree's own rules",
}


def _python_files(under: Path) -> Iterator[Path]:
    yield from sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in ``body``, those nested in functions, classes and blocks included (expressions
    are not entered: walking every node of every file would cost the suite a second)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            nested = getattr(node, field, None)
            if isinstance(nested, list):
                yield from _statements(nested)


def _imported_modules(tree: ast.Module, source: str) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every module an ``import``, ``from ... import`` (each name imported from
    a package counts as a module too: ``from tests.unit import test_x``) or ``importlib.import_module``
    of a constant string in ``tree`` may load; relative imports are not used in tests/."""
    node: ast.AST
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
    if "import_module" not in source and "__import__" not in source:
        return
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _module_file(name: str) -> Path | None:
    """The file under tests/ of the dotted module ``name`` (None: not one of tests/'s modules)."""
    if name != "tests" and not name.startswith("tests."):
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _source(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text, filename=str(path))


@functools.cache
def _tests_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each of tests/'s modules that ``path`` imports."""
    text, tree = _source(path)
    return [(line, name) for line, name in _imported_modules(tree, text) if _module_file(name) is not None]


def test_unit_folders_mirror_the_packages() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    stray = sorted(folders - packages - set(FOLDERS_OF_THE_REPOSITORY))
    assert not stray, f"tests/unit/{stray}: name each folder after the package of services/weightstream"
    unmarked = sorted(f for f in folders if not (UNIT / f / "__init__.py").is_file())
    assert not unmarked, f"tests/unit/{unmarked} need an __init__.py (tests import as tests.unit.<package>)"


def test_top_level_unit_tests_are_of_a_top_level_module_or_listed() -> None:
    modules = {f"test_{p.stem}.py" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    top = {p.name for p in UNIT.glob("test_*.py")}
    unplaced = sorted(top - modules - set(TOP_LEVEL_TESTS))
    assert not unplaced, (
        f"tests/unit/{unplaced}: move each into the folder of the package it tests "
        "(tests/unit/<package>/test_<module-or-concept>.py), or list it in TOP_LEVEL_TESTS saying why not"
    )
    assert not set(TOP_LEVEL_TESTS) - top, "TOP_LEVEL_TESTS lists a file that is gone"


def test_no_file_imports_a_test_module() -> None:
    offenders = [
        f"{_rel(path)}:{line} imports {name}"
        for path in _python_files(TESTS)
        for line, name in _tests_imports(path)
        if name.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert not offenders, (
        "a test module imports no other test module: move what both use into a helper module under "
        "tests/ (tests/params_files.py, tests/fleet.py, ...) or a conftest.py fixture\n"
        + "\n".join(offenders)
    )


def test_no_unit_test_reaches_tests_integration() -> None:
    """Directly or through tests/'s helper modules: integration's helpers start processes."""
    offenders = []
    for path in _python_files(UNIT):
        chain: dict[str, str] = {}  # module -> the module that imported it
        todo = [(name, _rel(path)) for _, name in _tests_imports(path)]
        while todo:
            name, via = todo.pop()
            if name in chain:
                continue
            chain[name] = via
            if name == "tests.integration" or name.startswith("tests.integration."):
                offenders.append(f"{_rel(path)} reaches {name} (imported by {via})")
                continue
            module = _module_file(name)
            assert module is not None
            todo += [(dep, _rel(module)) for _, dep in _tests_imports(module)]
    assert not offenders, "\n".join(offenders)

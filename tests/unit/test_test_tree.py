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
    "test_recovery_lines.py": "the client's lines for fault recovery (weightstream_client, not weightstream)",
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


# ---------------------------------------------------------------------------------------------------------
# No synchronisation by sleep
# ---------------------------------------------------------------------------------------------------------
# Every sleep in tests/, by (file, the function it is in, dotted through the functions and classes around
# it), and why it is one. A test that waits for another thread or process to reach a state polls that state
# with tests/waiting.py's ``wait_until`` (or waits on an event the code sets): a fixed sleep is too short on
# a loaded machine and wasted everywhere else. What stays is time the test means: a rate or a duration the
# code measures, a moment chosen on purpose, an absence that only time can show, and the polling primitives
# themselves. A sleep of the constant 0 waits for nothing (``asyncio.sleep(0)`` yields to the event loop
# once, ``time.sleep(0)`` the CPU) and is not listed.
SLEEPS_ALLOWED: dict[tuple[str, str], str] = {
    ("tests/waiting.py", "wait_until"): "the polling primitive: the pause between two looks at the state",
    ("tests/waiting.py", "wait_until_async"): "the polling primitive of coroutines, the same pause",
    (
        "tests/unit/jobs/test_job_changes.py",
        "test_duration_counts_the_run_under_way",
    ): "the code measures the run's wall time: time must pass for the duration to count, then stop",
    (
        "tests/unit/jobs/test_job_changes.py",
        "test_label_changes_at_the_same_time_all_count.slow_read",
    ): "a slow read widens the race window, so that unserialised changes would read the same labels",
    (
        "tests/unit/jobs/test_notify.py",
        "test_follow_reads_the_store_once_per_change_and_ends_with_the_job.main",
    ): "shows an absence: a quiet job is not read again, which only time can show",
    (
        "tests/integration/jobs/test_service.py",
        "test_capacity_priorities_and_cancel",
    ): "shows an absence: without a free slot no job starts; the scheduler, in another process, looks at "
    "the queue at least every 0.5 s and says nothing when it starts none, so 1 s covers two of its looks",
    (
        "tests/integration/jobs/test_service_limits.py",
        "test_cancel_at_any_moment_is_never_a_server_error.cancel_after",
    ): "the delay is the schedule: cancels land at chosen moments of a job's life",
    (
        "tests/integration/test_data_plane.py",
        "_role_memfds",
    ): "a sampler, not a wait: the roles' memfds are read every 0.05 s for as long as the run goes on",
    (
        "tests/integration/test_channel_reconnect.py",
        "test_a_channel_opened_after_a_replacement_connects_at_once",
    ): "calls spaced in time, so that the old channel is in gRPC's reconnect backoff when the replacement "
    "comes: the backoff is what the test is about",
    (
        "tests/integration/backends/test_container.py",
        "PodmanPlayedBackend.wait_ready",
    ): "a backend's wait_ready, as the coordinator calls it: it polls each pod's readiness probe as the "
    "kubelet does and must raise BackendError, as backends do, when the time is up",
    (
        "tests/integration/backends/test_kubernetes_recovery.py",
        "_fresh",
    ): "the backend answers dead() from what it saw less than poll_s ago: poll_s must pass for it to ask "
    "the API server again",
}


def _qualified_sleeps(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, enclosing function's dotted name or "<module>", what was called) of every sleep call in
    ``tree``: ``time.sleep``, a bare ``sleep``, any ``<x>.sleep`` (asyncio's, anyio's), except a sleep of
    the constant 0."""

    def visit(node: ast.AST, scope: tuple[str, ...]) -> Iterator[tuple[int, str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield from visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                zero = (
                    bool(child.args) and isinstance(child.args[0], ast.Constant) and child.args[0].value == 0
                )
                if name == "sleep" and not zero:
                    yield child.lineno, ".".join(scope) or "<module>", ast.unparse(func)
            yield from visit(child, scope)

    yield from visit(tree, ())


def test_no_test_sleeps_to_wait_for_another_thread_or_process() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for path in _python_files(TESTS):
        text, tree = _source(path)
        if "sleep" not in text:
            continue
        for line, scope, called in _qualified_sleeps(tree):
            found.setdefault((_rel(path), scope), []).append(f"{_rel(path)}:{line} {called}() in {scope}")
    unlisted = [call for key, calls in found.items() if key not in SLEEPS_ALLOWED for call in calls]
    assert not unlisted, (
        "a sleep that waits for another thread or process: wait for the state instead "
        "(tests/waiting.py's wait_until, or an event the code sets); a sleep whose time is the point goes "
        "in SLEEPS_ALLOWED with the reason\n" + "\n".join(unlisted)
    )
    stale = sorted(set(SLEEPS_ALLOWED) - set(found))
    assert not stale, f"SLEEPS_ALLOWED lists functions that sleep no more: {stale}"

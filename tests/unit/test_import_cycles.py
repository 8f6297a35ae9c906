"""No import circles among weightstream's modules, counting imports inside functions too.

pyproject.toml's ``acyclic_siblings`` contract says the same for lint-imports, package by package; this
scan keeps the rule in the unit suite and names a circle module by module. A deferred import is how a
circle usually hides ("local: X builds on this module"), so it reads every module's source with ``ast``:
each ``import``/``from ... import`` of a weightstream module, at any depth, is an edge, except under
``if TYPE_CHECKING:`` (never run). An edge goes to the module named, not to the packages above it.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).parents[2]
SERVICES = ROOT / "services"

Graph = dict[str, dict[str, int]]  # module -> {imported module: line of the first such import}


def _module(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, modules: set[str], package: str) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` imports anywhere in its source, with the line."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name and name not in modules:  # ``from m import a_function``: the module is m
            name = name.rpartition(".")[0]
        if name and name != module:
            found.setdefault(name, line)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source == package or source.startswith(package + "."):
                for alias in node.names:  # ``from pkg import submodule`` imports pkg.submodule
                    add(f"{source}.{alias.name}", node.lineno)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def import_graph(top: Path, package: str) -> Graph:
    """Every module of ``package`` (a folder under ``top``) and the modules of it that it imports."""
    paths = {_module(p, top): p for p in sorted((top / package).rglob("*.py"))}
    return {m: _imports(m, p, set(paths), package) for m, p in paths.items()}


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: Graph, component: list[str]) -> str:
    """One circle through the component's first module, each step with the line of its import."""
    inside = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:  # breadth-first: the shortest way back to ``start``
        v = queue.popleft()
        for w in graph[v]:
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                steps = [f"{a} (line {graph[a][b]})" for a, b in zip(path, [*path[1:], start], strict=True)]
                return " -> ".join([*steps, start]) + f"\n  the whole component: {', '.join(component)}"
            if w in inside and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is not strongly connected")


def test_weightstream_has_no_import_circles() -> None:
    graph = import_graph(SERVICES, "weightstream")
    assert len(graph) > 100, "the scan found too few modules: has the package moved?"
    found = circles(graph)
    assert not found, (
        "import circles (break them by moving what both sides use into a module of its own):\n"
        + ("\n".join(describe(graph, c) for c in found))
    )


def test_the_scan_sees_imports_in_functions_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c": 2}
    assert circles(graph) == []
    (pkg / "c.py").write_text("def g():\n    import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert describe(graph, ["pkg.a", "pkg.b", "pkg.c"]).startswith(
        "pkg.a (line 1) -> pkg.b (line 2) -> pkg.c (line 2) -> pkg.a"
    )

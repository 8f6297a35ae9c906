"""Load a benchmark script as a module: bench/ is scripts, not a package."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as module ``bench_<name>`` (registered before it runs, for its dataclasses)."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    if str(path.parent) not in sys.path:  # as when it runs as a script: its helpers (text_corpus) import
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = module
    spec.loader.exec_module(module)
    return module


def run_bench_json(name: str, args: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
    """``python bench/<name>.py ARGS`` in ``cwd``: it must succeed and print one JSON line alone on stdout
    (its progress goes to stderr); that line, parsed."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    proc = subprocess.run(
        [sys.executable, str(path), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    out: dict[str, Any] = json.loads(lines[0])
    return out

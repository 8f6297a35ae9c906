"""The repository rule against a work diary in the product: the pattern, the paths it covers, and the lines
under some paths that match it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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

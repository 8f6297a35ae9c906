"""Generates the performance page from bench/results/*.jsonl at build time (performance_page.py renders)."""

import sys
from pathlib import Path

import mkdocs_gen_files

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # mkdocs-gen-files runs this file by path: its sibling module is not importable

from performance_page import read_records, render  # noqa: E402

with mkdocs_gen_files.open("performance.md", "w") as out:
    out.write(render(read_records(HERE.parents[1] / "bench" / "results")))

"""Generates the performance page from bench/results/*.jsonl at build time."""

import mkdocs_gen_files

with mkdocs_gen_files.open("performance.md", "w") as out:
    out.write("# Performance\n")

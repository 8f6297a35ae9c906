"""Generates the reference pages (CLI, params keys, REST API, metrics) from the code at build time.

The rendering is in ``reference_pages`` (pure functions, tested in tests/unit/test_reference_pages.py);
this script only builds what they read (the click trees, the app, the registry) and writes the pages.
"""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).parent))  # reference_pages sits beside this script

from reference_pages.pages import PAGES

for path, render in PAGES.items():
    with mkdocs_gen_files.open(path, "w") as out:
        out.write(render())

"""The committed architecture diagram (docs/architecture.svg) is what its source renders today."""

from __future__ import annotations

import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "render_architecture.py"
SVG = ROOT / "docs" / "architecture.svg"


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_architecture", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_committed_svg_is_current() -> None:
    rendered = _renderer().render()
    assert SVG.read_text(encoding="utf-8") == rendered, (
        "docs/architecture.svg is stale: run python scripts/render_architecture.py and commit the result"
    )


def test_render_is_deterministic_and_well_formed() -> None:
    renderer = _renderer()
    first, second = renderer.render(), renderer.render()
    assert first == second
    root = ET.fromstring(first)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    for role in ("coordinator", "MemoryX shard 0", "SwarmX root", "CS-2 worker 0", "activation servers"):
        assert role in titles


def test_every_arrow_joins_two_boxes() -> None:
    renderer = _renderer()
    keys = {b.key for b in renderer.BOXES}
    assert len(keys) == len(renderer.BOXES), "box keys must be unique"
    for arrow in renderer.ARROWS:
        assert arrow.src in keys and arrow.dst in keys, arrow
        assert arrow.style in renderer.ARROW_STYLES, arrow

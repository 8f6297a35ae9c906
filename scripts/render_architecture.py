"""Render the architecture diagram (docs/architecture.svg) from the description in this file.

The picture is data: the boxes and arrows below. This script turns them into SVG text with nothing but
string formatting, so the output depends only on this file (no fonts measured, no clock, no network), and
``tests/unit/test_architecture_diagram.py`` can render it again and compare it with the committed file.

    python scripts/render_architecture.py           # write docs/architecture.svg
    python scripts/render_architecture.py --check   # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.svg"

WIDTH, HEIGHT = 900, 620


@dataclass(frozen=True)
class Box:
    """A role: its top-left corner and size in pixels, a title and a line saying what it holds or does."""

    key: str
    x: int
    y: int
    w: int
    h: int
    title: str
    notes: tuple[str, ...]
    style: str


@dataclass(frozen=True)
class Arrow:
    """A flow from the bottom of one box to the top of another (or between the sides named by ``sides``),
    shifted ``dx`` pixels sideways so flows in both directions between the same boxes stay apart."""

    src: str
    dst: str
    style: str
    dx: int = 0
    sides: str = "vertical"  # vertical: bottom/top; horizontal: left/right


# fill, stroke of each kind of box
BOX_STYLES = {
    "memoryx": ("#e8f0fe", "#3b6fd4"),
    "swarmx": ("#fdf1e0", "#d18a1f"),
    "worker": ("#e6f4ea", "#2f8f4e"),
    "activation": ("#f3e8fd", "#8a4fc7"),
    "coordinator": ("#f1f3f4", "#5f6368"),
}

# stroke, dash pattern, label of each kind of arrow (the legend)
ARROW_STYLES = {
    "weights": ("#3b6fd4", "", "weights, layer by layer (forward, then again for backward)"),
    "gradients": ("#d9480f", "", "gradients of each layer, summed on the way up"),
    "batches": ("#8a4fc7", "", "each worker's shard of the global batch"),
    "control": ("#5f6368", "6 4", "control: Configure, RunStep, GradNormSq, ApplyUpdate, SaveCheckpoint"),
}

BOXES = [
    Box("mx0", 20, 40, 180, 64, "MemoryX shard 0", ("fp32 weights + optimizer",), "memoryx"),
    Box("mx1", 260, 40, 180, 64, "MemoryX shard 1", ("fp32 weights + optimizer",), "memoryx"),
    Box("mxk", 500, 40, 180, 64, "MemoryX shard K-1", ("applies the update",), "memoryx"),
    Box("root", 265, 175, 170, 64, "SwarmX root", ("broadcast / reduce",), "swarmx"),
    Box("sx0", 95, 300, 170, 64, "SwarmX node", ("fan-out F",), "swarmx"),
    Box("sx1", 435, 300, 170, 64, "SwarmX node", ("fan-out F",), "swarmx"),
    Box("w0", 25, 425, 150, 64, "CS-2 worker 0", ("numpy",), "worker"),
    Box("w1", 185, 425, 150, 64, "CS-2 worker 1", ("numpy",), "worker"),
    Box("w2", 365, 425, 150, 64, "CS-2 worker 2", ("numpy",), "worker"),
    Box("wn", 525, 425, 150, 64, "CS-2 worker N-1", ("numpy",), "worker"),
    Box("act", 195, 540, 310, 50, "activation servers", ("read the training data",), "activation"),
    Box(
        "coord",
        715,
        150,
        170,
        150,
        "coordinator",
        (
            "plans a job's roles,",
            "starts them, drives",
            "each step, replaces",
            "a lost role; serves",
            "REST and gRPC",
        ),
        "coordinator",
    ),
]

ARROWS = [
    # weights down the tree, gradients up it: every MemoryX shard talks to the SwarmX root
    *(Arrow(m, "root", "weights", dx=-12) for m in ("mx0", "mx1", "mxk")),
    *(Arrow("root", m, "gradients", dx=12) for m in ("mx0", "mx1", "mxk")),
    *(Arrow("root", s, "weights", dx=-12) for s in ("sx0", "sx1")),
    *(Arrow(s, "root", "gradients", dx=12) for s in ("sx0", "sx1")),
    *(
        Arrow(s, w, "weights", dx=-12)
        for s, w in (("sx0", "w0"), ("sx0", "w1"), ("sx1", "w2"), ("sx1", "wn"))
    ),
    *(
        Arrow(w, s, "gradients", dx=12)
        for s, w in (("sx0", "w0"), ("sx0", "w1"), ("sx1", "w2"), ("sx1", "wn"))
    ),
    *(Arrow("act", w, "batches") for w in ("w0", "w1", "w2", "wn")),
    Arrow("coord", "mxk", "control", sides="horizontal"),
    Arrow("coord", "sx1", "control", sides="horizontal"),
    Arrow("coord", "wn", "control", sides="horizontal"),
]


def _box(b: Box) -> str:
    fill, stroke = BOX_STYLES[b.style]
    cx = b.x + b.w // 2
    return (
        f'<g class="role {b.style}">'
        f'<rect x="{b.x}" y="{b.y}" width="{b.w}" height="{b.h}" rx="8" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="2"/>'
        f'<text x="{cx}" y="{b.y + 26}" text-anchor="middle" font-size="15" font-weight="bold">'
        f"{escape(b.title)}</text>"
        + "".join(
            f'<text x="{cx}" y="{b.y + 46 + 17 * i}" text-anchor="middle" font-size="12" fill="#444">'
            f"{escape(line)}</text>"
            for i, line in enumerate(b.notes)
        )
        + "</g>"
    )


def _ends(a: Arrow, boxes: dict[str, Box]) -> tuple[int, int, int, int]:
    """Start and end points: a box's bottom edge to the other's top edge (whichever is above), or, for a
    horizontal arrow, the source's left edge to the target's right edge."""
    s, d = boxes[a.src], boxes[a.dst]
    if a.sides == "horizontal":
        y1 = s.y + s.h // 2 + (d.y + d.h // 2 - s.y - s.h // 2) // 4
        return s.x, y1, d.x + d.w, d.y + d.h // 2
    # each end leans a quarter of the way towards the other box, so several arrows into one box stay apart
    scx, dcx = s.x + s.w // 2, d.x + d.w // 2
    sx, dx = scx + a.dx + (dcx - scx) // 4, dcx + a.dx + (scx - dcx) // 4
    if s.y < d.y:  # flowing down
        return sx, s.y + s.h, dx, d.y
    return sx, s.y, dx, d.y + d.h


def _arrow(a: Arrow, boxes: dict[str, Box]) -> str:
    color, dash, _ = ARROW_STYLES[a.style]
    x1, y1, x2, y2 = _ends(a, boxes)
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<line class="{a.style}" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" '
        f'stroke-width="2"{dash_attr} marker-end="url(#head-{a.style})"/>'
    )


def _markers() -> str:
    return "".join(
        f'<marker id="head-{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{color}"/></marker>'
        for name, (color, _, _) in ARROW_STYLES.items()
    )


def _legend(x: int, y: int) -> str:
    rows = []
    for i, (name, (color, dash, label)) in enumerate(ARROW_STYLES.items()):
        ry = y + 22 * i
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        rows.append(
            f'<line x1="{x}" y1="{ry}" x2="{x + 34}" y2="{ry}" stroke="{color}" stroke-width="2"{dash_attr} '
            f'marker-end="url(#head-{name})"/>'
            f'<text x="{x + 44}" y="{ry + 4}" font-size="12">{escape(label)}</text>'
        )
    return "".join(rows)


def render() -> str:
    """The SVG document, as text ending in a newline."""
    boxes = {b.key: b for b in BOXES}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 110}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT + 110}" font-family="Helvetica, Arial, sans-serif">',
        "<title>weightstream: roles and the data flow of a training step</title>",
        f"<defs>{_markers()}</defs>",
        f'<rect width="{WIDTH}" height="{HEIGHT + 110}" fill="#ffffff"/>',
        *(_arrow(a, boxes) for a in ARROWS),
        *(_box(b) for b in BOXES),
        f'<text x="350" y="{HEIGHT - 5}" text-anchor="middle" font-size="12" fill="#444">'
        "1 to N workers is a flag (num_csx); the SwarmX tree grows with log N</text>",
        _legend(40, HEIGHT + 25),
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed SVG is not current")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    svg = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != svg:
            print(f"{args.output} is stale: run python scripts/render_architecture.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(svg, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

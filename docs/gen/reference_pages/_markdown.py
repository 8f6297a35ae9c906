"""Markdown that renders text as written: help texts and descriptions keep their code spans, and what
markdown would otherwise read as markup (``*``, ``<tag>``, ``[link]``, a ``|`` inside a table) is escaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["code", "paragraphs", "table", "text"]

# a run of backquotes opens a code span that the same run closes (CommonMark's rule)
_TICKS = re.compile(r"`+")
_MARKUP = re.compile(r"([\\*_\[\]<>#])")


def _spans(s: str) -> Iterable[tuple[bool, str]]:
    """(is code, piece) of ``s``; a backquote run with no closing run of the same length is plain text."""
    at = 0
    plain_from = 0
    while (m := _TICKS.search(s, at)) is not None:
        close = re.compile(rf"(?<!`){m.group(0)}(?!`)").search(s, m.end())
        if close is None:
            at = m.end()
            continue
        yield False, s[plain_from : m.start()]
        yield True, s[m.start() : close.end()]
        at = plain_from = close.end()
    yield False, s[plain_from:]


def text(s: str, cell: bool = False) -> str:
    """``s`` as markdown prose that renders it literally, code spans kept; ``cell``: for a table cell
    (one line, ``|`` escaped)."""
    out = []
    for is_code, piece in _spans(s):
        if is_code:
            out.append(piece)
            continue
        piece = _MARKUP.sub(r"\\\1", piece).replace("`", "\\`")
        out.append(piece.replace("|", "\\|") if cell else piece)
    joined = "".join(out)
    return " ".join(joined.split()) if cell else joined


def code(s: object) -> str:
    """``s`` as one inline code span, whatever backquotes it holds (a fence longer than its longest)."""
    value = " ".join(str(s).split())
    longest = max((len(m.group(0)) for m in _TICKS.finditer(value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def paragraphs(s: str) -> str:
    """A multi-paragraph help text or description as markdown paragraphs (blank lines kept)."""
    blocks = [b.strip() for b in re.split(r"\n\s*\n", s.strip()) if b.strip()]
    return "\n\n".join(text(" ".join(b.split())) for b in blocks)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table; its cells are markdown already (``code``, ``text(..., cell=True)``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c if c else " " for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"

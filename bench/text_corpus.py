"""The text the benches train on: plain-text files of this machine, as byte tokens.

Licenses and package docs rather than this repository's files, which change from commit to commit. Shared
by bench/beyond_ram.py and bench/peer.py (run as scripts, bench/ is on sys.path; tests load them with
tests/bench_module.py, which puts it there too).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEXT_SOURCES", "text_corpus"]

TEXT_SOURCES = ("/usr/share/common-licenses", "/usr/share/doc")  # text that is on every Debian machine


def text_corpus(dest: Path, min_bytes: int, required: int | None = None) -> int:
    """Copy UTF-8 text files (over 2000 bytes) into ``dest`` as *.txt, in path order, until ``min_bytes``
    (byte tokens for TextFileDataProcessor). Exits if fewer than ``required`` (default ``min_bytes``)
    bytes were found; returns the bytes copied."""
    dest.mkdir(parents=True, exist_ok=True)
    total, i = 0, 0
    for root in TEXT_SOURCES:
        for path in sorted(Path(root).rglob("*")) if Path(root).is_dir() else []:
            if total >= min_bytes:
                return total
            if not path.is_file() or path.is_symlink() or path.suffix not in ("", ".txt"):
                continue
            try:
                data = path.read_bytes()
                data.decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(data) > 2000:
                (dest / f"{i:05d}.txt").write_bytes(data)
                total, i = total + len(data), i + 1
    need = min_bytes if required is None else required
    if total < need:
        raise SystemExit(f"only {total} bytes of text under {TEXT_SOURCES}, {need} needed")
    return total

"""A params file's text: read as UTF-8 and parsed as YAML, every failure a ParamsError naming the file
(and, for YAML, the line and column)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from weightstream.params.errors import ParamsError, Problem

__all__ = ["parse_params", "read_params_text"]

_SECTIONS = ("train_input", "eval_input", "model", "optimizer", "runconfig")


def read_params_text(path: str | Path) -> str:
    """The text of params file ``path``; ParamsError naming the file when it cannot be read or is not
    UTF-8 (YAML files are; ModelZoo's are)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ParamsError([Problem("<file>", f"cannot be read: {e.strerror}", str(path))], str(path)) from e
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        why = (
            f"is not UTF-8 text: byte 0x{e.object[e.start]:02x} at line {line} (byte offset {e.start}) "
            "cannot be decoded; save the file as UTF-8"
        )
        raise ParamsError([Problem("<file>", why)], str(path)) from None


def parse_params(text: str, source: str = "params") -> dict[str, Any]:
    """YAML text -> a mapping (not yet validated). ``source`` names the file in problems."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ParamsError([Problem("<file>", _yaml_problem(e))], source) from None
    if not isinstance(raw, dict):
        raise ParamsError(
            [
                Problem(
                    "<file>",
                    "must be a mapping: trainer: (ModelZoo 2.3 and later) or the sections "
                    + ", ".join(_SECTIONS),
                    type(raw).__name__,
                )
            ],
            source,
        )
    return raw


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error as one line with the line and column (1-based) where it found the problem; its own
    text names ``"<unicode string>"`` instead of the file."""
    mark, context = getattr(e, "problem_mark", None), getattr(e, "context", None)
    if mark is None:
        return f"is not valid YAML: {e}"
    what = getattr(e, "problem", None) or str(e)
    text = f"is not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
    start = getattr(e, "context_mark", None)
    if context and start is not None:
        text += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    return text

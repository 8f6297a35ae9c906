"""Where each key of a params file lives: the key paths a user wrote, and the canonical (legacy) layout.

weightstream validates one layout, ModelZoo's legacy one (``train_input``, ``eval_input``, ``model``,
``optimizer``, ``sparsity``, ``runconfig``). A ``trainer:`` file is first translated into it
(``trainer_layout.py``); an ``Origin`` remembers, for every translated key, the path the user wrote, so
that every problem and every line of the key report names the key as it appears in the user's file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from weightstream.params.errors import Problem

__all__ = ["KeyUse", "Origin", "join", "leaves", "relocate"]


def join(prefix: str, key: str | int) -> str:
    """``prefix`` + one more key: ``a.b`` or ``a[3]``."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "[")


@dataclass
class Origin:
    """Canonical key path -> the path the user wrote (longest prefix wins); identity where unmapped."""

    moves: dict[str, str] = field(default_factory=dict)

    def add(self, canonical: str, written: str) -> None:
        self.moves[canonical] = written

    def __call__(self, path: str) -> str:
        best = max((p for p in self.moves if _within(path, p)), key=len, default=None)
        if best is None:
            return path
        return self.moves[best] + path[len(best) :]


def relocate(problems: list[Problem], origin: Origin) -> list[Problem]:
    """``problems`` with each path as the user wrote it; a message that names another canonical key
    (``must be divisible by runconfig.num_csx=2``) names it as written too."""
    if not origin.moves:
        return problems

    def key(m: re.Match[str]) -> str:
        path = m.group(0)  # a file name such as model.safetensors is not a key
        return path if path.rsplit(".", 1)[-1] in _FILE_SUFFIXES else origin(path)

    def message(text: str) -> str:
        return _KEY_PATH.sub(key, text)

    return [replace(q, path=origin(q.path), message=message(q.message)) for q in problems]


_FILE_SUFFIXES = {"safetensors", "json", "bin", "h5", "yaml", "txt", "jsonl", "gz"}
# a canonical key path inside a message: a legacy section, then .key or [i] parts; not the tail of a
# path already as written (trainer.init.model.name holds model.name)
_KEY_PATH = re.compile(
    r"(?<![\w.])(?:train_input|eval_input|model|optimizer|sparsity|runconfig)(?:\.[A-Za-z_]\w*|\[\d+\])+"
)


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf of a parsed YAML tree; a list of scalars is one leaf (``betas``), a
    list of mappings is walked item by item (``learning_rate[1].total_iters``)."""
    if isinstance(node, dict):
        if not node and prefix:
            yield prefix, node
        for k, v in node.items():
            yield from leaves(v, join(prefix, str(k)))
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        for i, v in enumerate(node):
            yield from leaves(v, join(prefix, i))
    else:
        yield prefix, node


@dataclass(frozen=True)
class KeyUse:
    """One line of the key report: a key the user wrote, its value, and what weightstream does with it."""

    path: str
    value: Any
    action: str  # "used" | "not applicable"
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.path, "value": self.value, "action": self.action, "note": self.note}

"""The legacy-layout params a ``trainer:`` file is being translated into, with where each key came from,
what was reported and what was refused. ``trainer_layout.py`` walks the file and ``trainer_callbacks.py``
its callbacks and loggers; both write through a ``Translation``, so neither needs the other.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from weightstream.params.errors import Problem
from weightstream.params.layout import KeyUse, Origin, join

__all__ = ["Translation"]


@dataclass
class Translation:
    legacy: dict[str, Any] = field(default_factory=dict)
    origin: Origin = field(default_factory=Origin)
    uses: list[KeyUse] = field(default_factory=list)  # keys with no legacy home, reported here
    problems: list[Problem] = field(default_factory=list)
    # legacy path -> the other keys that gave it the same value (the key report names them at the first)
    also: dict[str, list[str]] = field(default_factory=dict)
    optimizer_lr: tuple[Any, str] | None = None  # the optimizer's own rate and where it was written

    def put(self, legacy_path: str, value: Any, written: str) -> None:
        """Set ``legacy_path`` (``section.key``) to ``value``, remembering where the user wrote it."""
        section, _, key = legacy_path.partition(".")
        target = self.legacy.setdefault(section, {})
        if not key:
            self.legacy[section] = value
        elif key in target:
            self._again(legacy_path, target[key], value, written)
            return
        else:
            target[key] = value
        self.origin.add(legacy_path, written)

    def section(self, legacy_section: str, value: Any, written: str) -> None:
        """A whole section copied over (``model``, ``sparsity``, a dataloader): its keys stay as written."""
        if not isinstance(value, dict):
            self.problems.append(Problem(written, "must be a mapping", value))
            return
        target = self.legacy.setdefault(legacy_section, {})
        for key, v in value.items():
            if key in target:
                self._again(join(legacy_section, key), target[key], v, join(written, key))
            else:
                target[key] = v
        self.origin.add(legacy_section, written)

    def _again(self, legacy_path: str, first: Any, value: Any, written: str) -> None:
        """A second key for one setting (ModelZoo 2.3 and 2.4 write the precision in ``model`` and in
        ``trainer.init.precision``): the same value is one setting, kept where first written and reported
        there; different values are refused, naming both keys and both values."""
        first_at = self.origin(legacy_path)
        if _same(first, value):
            self.also.setdefault(legacy_path, []).append(written)
        else:
            self.problems.append(
                Problem(
                    written,
                    f"is the same setting as {first_at}, which is {first!r}: give one value, "
                    "or the same value in both",
                    value,
                )
            )

    def report(self, written: str, value: Any, note: str) -> None:
        self.uses.append(KeyUse(written, value, "not applicable", note))

    def unknown(self, written: str, key: str, known: Sequence[str]) -> None:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        self.problems.append(Problem(written, f"is not a known key{hint} allowed here: {', '.join(known)}"))

    def mapping(self, value: Any, at: str) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        self.problems.append(Problem(at, "must be a mapping", value))
        return {}

    def entries(self, items: list[Any], at: str, what: str) -> Iterator[tuple[str, Any, str]]:
        """(name, settings, path) of each ``{Name: {...}}`` item of a list (callbacks, loggers)."""
        for i, item in enumerate(items):
            entry = self.one_entry(item, join(at, i), what)
            if entry is not None:
                yield entry[0], entry[1], join(join(at, i), entry[0])

    def one_entry(self, value: Any, at: str, what: str) -> tuple[str, Any] | None:
        """A ``{Name: {...}}`` mapping (an optimizer, a scheduler, a callback): its name and settings."""
        if isinstance(value, dict) and len(value) == 1:
            name, settings = next(iter(value.items()))
            return str(name), {} if settings is None else settings
        self.problems.append(Problem(at, f"must be one {what} as {{Name: {{settings}}}}", value))
        return None


def _same(a: Any, b: Any) -> bool:
    """Equal values that mean one thing: ``true`` and ``1`` do not (a switch and a number)."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)

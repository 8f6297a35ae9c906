"""Errors of the params boundary: every problem names the key path, the value and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ParamsError", "Problem"]

_MISSING = object()


@dataclass(frozen=True)
class Problem:
    path: str  # e.g. "model.hidden_size" or "optimizer.learning_rate[1].scheduler"
    message: str  # what is wrong and what is allowed
    value: Any = _MISSING

    def __str__(self) -> str:
        got = "" if self.value is _MISSING else f" (got {self.value!r})"
        return f"{self.path}: {self.message}{got}"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "message": self.message}
        if self.value is not _MISSING:
            d["value"] = self.value
        return d


class ParamsError(ValueError):
    """A params file that cannot be run. Permanent: retrying with the same file gives the same error."""

    def __init__(self, problems: list[Problem], source: str = "params") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  - {p}" for p in problems)
        n = len(problems)
        super().__init__(f"invalid {source} ({n} problem{'s' if n != 1 else ''}):\n{lines}")

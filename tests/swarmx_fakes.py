"""A SwarmX node's upstream faked, in-process: what it fetched and what was pushed to it, and a ``gate`` the
test opens to let a fetch go on."""

from __future__ import annotations

import threading

import numpy as np


class FakeUpstream:
    """Answers a fetch with one piece of a unit's weights once ``gate`` is open (5 s at most); records
    fetches and pushes in call order."""

    def __init__(self) -> None:
        self.fetches: list[tuple[int, int, int]] = []
        self.pushed: list[tuple[int, int, dict[str, np.ndarray]]] = []
        self.gate = threading.Event()

    def fetch_unit(self, step: int, unit: int, pass_: int) -> list[dict[str, np.ndarray]]:
        self.gate.wait(5)
        self.fetches.append((step, unit, pass_))
        return [{"w": np.full(3, float(step * 10 + unit), dtype=np.float32)}]

    def push_grads(self, step: int, unit: int, grads: dict[str, np.ndarray]) -> None:
        self.pushed.append((step, unit, grads))


class TrickleUpstream(FakeUpstream):
    """Yields a unit's pieces one by one, the last only when told to."""

    def fetch_unit(self, step: int, unit: int, pass_: int):  # type: ignore[no-untyped-def]
        yield "first"
        yield "second"
        self.gate.wait(5)
        yield "last"

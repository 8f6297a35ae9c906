"""A SwarmX node's upstream faked, in-process: what it fetched and what was pushed to it, and a ``gate`` the
test opens to let a fetch go on."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from weightstream.swarmx.node import Unit


class FakeUpstream:
    """Answers a fetch with one piece of a unit's weights once ``gate`` is open (5 s at most); records
    fetches and pushes in call order."""

    shares_memory = False  # its children's gradients come up as bytes, never relayed as a header
    reader: Any = None  # the node never reads what it hands down

    def __init__(self) -> None:
        self.fetches: list[tuple[int, int, int]] = []
        self.pushed: list[tuple[int, int, dict[str, np.ndarray]]] = []
        self.gate = threading.Event()

    def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterable[Unit]:
        self.gate.wait(5)
        self.fetches.append((step, unit, pass_))
        return [{"w": np.full(3, float(step * 10 + unit), dtype=np.float32)}]

    def push_grads(self, step: int, unit: int, grads: dict[str, np.ndarray]) -> None:
        self.pushed.append((step, unit, grads))

    def relay_grads(self, step: int, unit: int, header: Any) -> None:
        raise AssertionError("nothing is relayed to an upstream that shares no memory")


class TrickleUpstream(FakeUpstream):
    """Yields a unit's pieces one by one, the last only when told to."""

    def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterator[Unit]:
        yield "first"
        yield "second"
        self.gate.wait(5)
        yield "last"


def push_through(upstream: Any, clients: list[Any]) -> None:
    """Make a root's ``MemoryXUpstream`` push to ``clients`` (one per shard, each called as the generated
    client is, ``client(messages, timeout)``) in place of its shards, over the same planes."""
    upstream.sinks = [
        [(peer, clients[shard], plane) for peer, _, plane in sinks]
        for shard, sinks in enumerate(upstream.sinks)
    ]

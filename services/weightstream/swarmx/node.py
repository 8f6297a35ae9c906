"""A SwarmX node: broadcast down, reduce up. No gRPC here; the upstream is an interface.

Broadcast: children *pull* a unit; the first request for (step, unit, pass) fetches it from upstream
once and every other child is served the same copy (single flight), so weights leave MemoryX once per
pass per tree, not once per worker. The copy is whatever the upstream returns: the gRPC node keeps the
raw messages and relays them without decoding (the worker checks the checksums end to end).
Reduce: each child pushes its gradient of a unit; when all children have, they are summed in child
order (never arrival order) and pushed upstream as one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["SwarmNodeLogic", "Upstream", "sum_in_order"]

Tensors = dict[str, np.ndarray]
Unit = Any  # what the upstream hands down: raw messages over gRPC, anything in tests


class Upstream(Protocol):
    def fetch_unit(self, step: int, unit: int, pass_: int) -> Unit: ...

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None: ...


@dataclass
class _Flight:
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)
    unit: Unit = None
    error: BaseException | None = None


def sum_in_order(parts: list[Mapping[str, np.ndarray]]) -> Tensors:
    """Elementwise sum of the children's gradients, child 0 first: the same bits for the same inputs."""
    out: Tensors = {}
    for name in parts[0]:
        total = parts[0][name].astype(np.float32, copy=True)
        for p in parts[1:]:
            total += p[name]
        out[name] = total
    return out


class SwarmNodeLogic:
    def __init__(self, num_children: int, upstream: Upstream, timeout_s: float) -> None:
        self.num_children, self.upstream, self.timeout_s = num_children, upstream, timeout_s
        self._lock = threading.Lock()
        self._flights: dict[tuple[int, int, int], _Flight] = {}
        self._grads: dict[tuple[int, int], list[Mapping[str, np.ndarray] | None]] = {}
        self.fetches_upstream = 0  # how many units this node pulled from upstream (broadcast accounting)
        self._closed = False

    def close(self) -> None:
        """Stop (the job was reconfigured after a fault): children waiting for a unit are released with an
        error at once, and the gradients held so far are dropped."""
        with self._lock:
            self._closed = True
            flights, self._flights, self._grads = list(self._flights.values()), {}, {}
        for flight in flights:
            if not flight.done.is_set():
                flight.error = RuntimeError("this SwarmX node was reconfigured: the step is abandoned")
                flight.done.set()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this SwarmX node was reconfigured: the step is abandoned")

    def get_unit(self, step: int, unit: int, pass_: int) -> Unit:
        key = (step, unit, pass_)
        with self._lock:
            self._check_open()
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight(remaining=self.num_children)
        if leader:
            try:
                flight.unit = self.upstream.fetch_unit(step, unit, pass_)
                self.fetches_upstream += 1
            except BaseException as e:
                flight.error = e
            finally:
                flight.done.set()
        elif not flight.done.wait(self.timeout_s):
            raise TimeoutError(
                f"unit {unit} of step {step} (pass {pass_}) not received after {self.timeout_s}s"
            )
        with self._lock:
            flight.remaining -= 1
            if flight.remaining <= 0 and self._flights.get(key) is flight:
                del self._flights[key]  # every child has it: forget it, memory stays one unit per pass
        if flight.error is not None:
            raise flight.error
        return flight.unit

    def push_grads(self, step: int, unit: int, child: int, grads: Mapping[str, np.ndarray]) -> None:
        """Store one child's gradient; the last child to arrive sums and pushes upstream (its call
        returns when upstream has accepted the sum, so back-pressure reaches the slowest link)."""
        if not 0 <= child < self.num_children:
            raise ValueError(f"child index {child} out of range 0..{self.num_children - 1}")
        key = (step, unit)
        with self._lock:
            self._check_open()
            slots = self._grads.setdefault(key, [None] * self.num_children)
            if slots[child] is not None:
                raise ValueError(f"child {child} pushed unit {unit} of step {step} twice")
            slots[child] = grads
            complete = all(s is not None for s in slots)
            if complete:
                del self._grads[key]
        if complete:
            parts = [s for s in slots if s is not None]
            self.upstream.push_grads(step, unit, sum_in_order(parts) if len(parts) > 1 else dict(parts[0]))

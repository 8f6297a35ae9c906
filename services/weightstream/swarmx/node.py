"""A SwarmX node: broadcast down, reduce up. No gRPC here; the upstream is an interface.

Broadcast: children *pull* a unit; the first request for (step, unit, pass) fetches it from upstream
once and every other child is served the same copy (single flight), so weights leave MemoryX once per
pass per tree, not once per worker. The copy is whatever the upstream yields: the gRPC node keeps the raw
messages and relays them without decoding (the worker checks the checksums end to end). Cut-through: each
message goes down as soon as it has arrived, so a tree of depth d costs about one unit's transfer plus d
messages, not d whole units (store-and-forward, which `weightstream simulate` shows breaking scaling).
Reduce: each child pushes its gradient of a unit; when all children have, they are summed in child
order (never arrival order) and pushed upstream as one. A node with a single child has nothing to sum:
where the child and the upstream both share its memory (transport/peers.py) it passes the child's header
on as it came (``relay_grads``), so the bytes are neither mapped nor checked here, only by MemoryX, end to
end, as the weights are by the worker.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from weightstream.transport.errors import RoleClosedError

__all__ = ["SwarmNodeLogic", "Upstream", "sum_in_order"]

Tensors = dict[str, np.ndarray]
Unit = Any  # a piece of what the upstream hands down: a raw message over gRPC, anything in tests
_CLOSED = "this SwarmX node was closed (its role is stopping or was reconfigured): the step is abandoned"


class Upstream(Protocol):
    # whether gradients in shared memory may go up as a header alone (``relay_grads``), and what reads
    # what the upstream hands down (a data plane, transport/plane.py; opaque here)
    @property
    def shares_memory(self) -> bool: ...

    @property
    def reader(self) -> Any: ...

    def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterable[Unit]: ...

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None: ...

    def relay_grads(self, step: int, unit: int, header: Any) -> None:
        """Pass on gradients that lie in shared memory: ``header`` names them, their bytes stay put."""
        ...


class _Flight:
    """One (step, unit, pass) on its way down: what upstream yields is kept in order, and each child reads
    it at its own pace, waiting only for what has not arrived yet."""

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining  # children that have not finished reading it
        self.items: list[Unit] = []
        self.done = False
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    def add(self, item: Unit) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self.cond:
            self.done, self.error = True, error
            self.cond.notify_all()

    def _arrived(self, i: int) -> bool:
        """Whether item ``i`` is here or none will come (called holding ``cond``)."""
        return i < len(self.items) or self.done

    def read(self, what: str, timeout_s: float) -> Iterator[Unit]:
        i = 0
        while True:
            with self.cond:
                if not self.cond.wait_for(functools.partial(self._arrived, i), timeout_s):
                    raise TimeoutError(f"{what}: nothing more received after {timeout_s}s")
                if i >= len(self.items):
                    if self.error is not None:
                        raise self.error
                    return
                item = self.items[i]
            i += 1
            yield item


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
    def __init__(
        self,
        num_children: int,
        upstream: Upstream,
        timeout_s: float,
        children: Any = None,
        bf16: bool = False,
    ) -> None:
        """``children``: the data plane children that share this node's memory call it on (None: none
        may; transport/plane.py, opaque here). ``bf16``: float32 travels as bfloat16 in this job."""
        self.num_children, self.upstream, self.timeout_s = num_children, upstream, timeout_s
        self.children, self.bf16 = children, bf16
        self._lock = threading.Lock()
        self._flights: dict[tuple[int, int, int], _Flight] = {}
        self._grads: dict[tuple[int, int], list[Mapping[str, np.ndarray] | None]] = {}
        self.fetches_upstream = 0  # how many units this node pulled from upstream (broadcast accounting)
        self._closed = False
        # one thread per unit in flight: a worker prefetches one unit ahead, and a pass may still be
        # draining while the next begins
        self._pullers = ThreadPoolExecutor(4, thread_name_prefix="swarmx-pull")

    def close(self) -> None:
        """Stop (the job was reconfigured after a fault): children waiting for a unit are released with an
        error at once, and the gradients held so far are dropped."""
        with self._lock:
            self._closed = True
            flights, self._flights, self._grads = list(self._flights.values()), {}, {}
        for flight in flights:
            if not flight.done:
                flight.finish(RoleClosedError(_CLOSED))
        self._pullers.shutdown(wait=False, cancel_futures=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RoleClosedError(_CLOSED)

    def get_unit(self, step: int, unit: int, pass_: int) -> Iterator[Unit]:
        """The unit's pieces as they arrive; the first child to ask makes this node fetch it."""
        key = (step, unit, pass_)
        with self._lock:
            self._check_open()
            flight = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = _Flight(remaining=self.num_children)
                self._pullers.submit(self._pull, key, flight)
        return self._serve(key, flight)

    def _pull(self, key: tuple[int, int, int], flight: _Flight) -> None:
        """Upstream into the flight, in a thread of its own: no child's pace slows the others."""
        try:
            for item in self.upstream.fetch_unit(*key):
                flight.add(item)
            self.fetches_upstream += 1
            flight.finish()
        except BaseException as e:
            flight.finish(e)

    def _serve(self, key: tuple[int, int, int], flight: _Flight) -> Iterator[Unit]:
        step, unit, pass_ = key
        try:
            yield from flight.read(f"unit {unit} of step {step} (pass {pass_})", self.timeout_s)
        finally:
            with self._lock:
                flight.remaining -= 1
                if flight.remaining <= 0 and self._flights.get(key) is flight:
                    del self._flights[key]  # every child has it: forget it, memory stays one unit per pass

    def relay_grads(self, step: int, unit: int, child: int, header: Any) -> None:
        """A single child's gradients that lie in shared memory, passed upstream as the header that names
        them: nothing to sum, so nothing to read. The call returns when upstream has accepted them (the
        child holds its memfd open until then, so the location stays valid for the receiver)."""
        if self.num_children != 1:
            raise ValueError(f"a node of {self.num_children} children sums gradients: it cannot relay them")
        self._check_child(child)
        with self._lock:
            self._check_open()
        self.upstream.relay_grads(step, unit, header)

    def _check_child(self, child: int) -> None:
        if not 0 <= child < self.num_children:
            raise ValueError(f"child index {child} out of range 0..{self.num_children - 1}")

    def push_grads(self, step: int, unit: int, child: int, grads: Mapping[str, np.ndarray]) -> None:
        """Store one child's gradient; the last child to arrive sums and pushes upstream (its call
        returns when upstream has accepted the sum, so back-pressure reaches the slowest link)."""
        self._check_child(child)
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

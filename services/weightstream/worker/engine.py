"""The CS-2 worker's step: units stream in, forward, loss, units stream in again, backward, gradients out.

The worker holds at most two units' weights (the one computing and the next, prefetched in the
background) and its own activations. Activations: while the memory budget allows, a unit keeps what its
backward needs; past the budget it keeps only its input and recomputes its forward in backward with the
weights that stream in again anyway. So memory does not grow with the model's size, only with depth by
one input activation per unit. No gRPC here: weights and batches come through small interfaces.
"""

from __future__ import annotations

import resource
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from weightstream.numerics import ModelDef
from weightstream.numerics.dropout import dropout_scope
from weightstream.numerics.layers import cross_entropy_backward, cross_entropy_forward
from weightstream.numerics.model import accumulate_grads
from weightstream.transport.errors import RoleClosedError

__all__ = ["BatchSource", "StepOutcome", "UnitSource", "WorkerEngine"]

FORWARD, BACKWARD, EVAL = 0, 1, 2
# Gradients of at most this many units are on their way up while backward goes on: one is enough to
# overlap the reduction of unit l with the backward of unit l-1, and keeps the worker's memory flat.
_PUSHES_IN_FLIGHT = 1
Tensors = dict[str, np.ndarray]


class UnitSource(Protocol):
    def get_unit(self, step: int, unit: int, phase: int) -> Tensors: ...

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None: ...


class BatchSource(Protocol):
    def get(
        self, split: str, step: int, worker: int, num_workers: int
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(inputs, targets, the global batch's loss denominator: its counted targets, or batch_size /
        loss_weight, see ``data.loss_scaling``) of worker ``worker``'s shard; a target of -1 is padding,
        which the loss ignores."""
        ...


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # this worker's share of the global mean loss
    tokens: int  # counted target tokens (not padding) in this worker's shard
    compute_s: float
    wait_s: float  # time blocked waiting for weights or for gradient pushes
    peak_rss_bytes: int
    recomputed_units: int


def nbytes(obj: Any) -> int:
    """Bytes of every array inside a saved-activations structure (tuples, NamedTuples, arrays)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, tuple | list):
        return sum(nbytes(o) for o in obj)
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class WorkerEngine:
    def __init__(
        self,
        model: ModelDef,
        index: int,
        num_workers: int,
        units: UnitSource,
        batches: BatchSource,
        memory_budget_bytes: int | None = None,
        micro_batch: int | None = None,
        pipelined: bool = False,
        seed: int = 0,
    ) -> None:
        self.model, self.index, self.num_workers = model, index, num_workers
        self.units, self.batches, self.budget = units, batches, memory_budget_bytes
        self.micro_batch, self.pipelined = micro_batch, pipelined
        self.seed = seed  # dropout masks: a function of (seed, step, global sample, site) only
        unit_bytes = [model.unit_bytes(u) for u in range(len(model.units))]
        # weights count against the budget first: two units while streaming, all of them when pipelined
        self.weight_bytes = sum(unit_bytes) if pipelined else 2 * max(unit_bytes)
        # two: at a step's start units 0 and 1 are asked for at once (``run_step``); one at a time after
        self._fetch = ThreadPoolExecutor(2, thread_name_prefix=f"worker{index}-prefetch")
        self._push = ThreadPoolExecutor(1, thread_name_prefix=f"worker{index}-push")
        self._closed = False

    def close(self) -> None:
        """Stop: a step still running (of a configuration the coordinator has replaced after a fault)
        gives up at its next unit instead of computing on."""
        self._closed = True
        self._fetch.shutdown(wait=False, cancel_futures=True)
        self._push.shutdown(wait=False, cancel_futures=True)

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> RoleClosedError:
        return RoleClosedError(
            f"worker {self.index} was closed (its role is stopping or was reconfigured): this step's "
            "attempt is abandoned"
        )

    @contextmanager
    def _giving_up_once_closed(self) -> Iterator[None]:
        """Whatever a step or an evaluation fails with once ``close`` has run (a fetch the shut-down pool
        refuses or cancelled, an upstream closed too) is this role closing: RoleClosedError, which callers
        see as UNAVAILABLE and retry at the replacement, not the symptom (INTERNAL, a failed job)."""
        try:
            yield
        except RoleClosedError:
            raise
        except Exception as e:
            if self._closed:
                raise self._closed_error() from e
            raise

    def _stream(
        self,
        step: int,
        order: list[int],
        phase: int,
        clock: list[float],
        started: Iterable[Future[Tensors]] = (),
    ) -> Iterator[tuple[int, Tensors]]:
        """Yield (unit, weights) in ``order``, fetching the next unit while the caller computes this one.
        ``started``: the fetches of ``order[0]``, ``order[1]``, ... already under way (at most two)."""
        pending = deque(started)  # a future holds its result: once popped, only ``params`` may
        del started  # nor may the caller's list, or a unit would outlive its use
        asked = len(pending)  # units of ``order`` asked for so far

        def ask() -> None:
            nonlocal asked
            pending.append(self._fetch.submit(self.units.get_unit, step, order[asked], phase))
            asked += 1

        if not pending:
            ask()
        for u in order:
            self._check_open()
            t0 = time.perf_counter()
            params = pending.popleft().result()
            clock[0] += time.perf_counter() - t0
            if not pending and asked < len(order):
                ask()
            yield u, params
            del params  # at most this unit and the prefetched next one are alive

    def run_step(self, step: int) -> StepOutcome:
        """Forward and backward of this worker's shard of step ``step``.

        The shard runs as micro-batches: each unit, while its weights are here, runs over every
        micro-batch, and its gradient is the sum over micro-batches in order (deterministic)."""
        with self._giving_up_once_closed():
            return self._run_step(step)

    def _run_step(self, step: int) -> StepOutcome:
        t_start = time.perf_counter()
        wait = [0.0]
        # the first units' weights are asked for first: at a step's start they wait for MemoryX to update
        # them, and the batch arrives meanwhile. Units 0 and 1 at once: asked for only once unit 0 was
        # here, unit 1's round trip through SwarmX and MemoryX was a wait every step (~7 ms at GPT-2
        # d512/L4, its update long done); the two are the most the stream holds anyway
        n_units = len(self.model.units)
        opening = [self._fetch.submit(self.units.get_unit, step, u, FORWARD) for u in range(min(2, n_units))]
        # denom: the global batch's loss denominator (counted tokens: the shard alone cannot tell them)
        x, y, denom = self.batches.get("train", step, self.index, self.num_workers)
        m = self.micro_batch or len(x)
        xs = [x[i : i + m] for i in range(0, len(x), m)]  # micro-batches: [m, ...] each
        ys = [y[i : i + m] for i in range(0, len(y), m)]
        first = [self.index * len(x) + i for i in range(0, len(x), m)]  # global index of each one's row 0
        inputs: list[list[np.ndarray]] = []
        saved: list[list[Any]] = []
        resident: dict[int, Tensors] = {}
        kept = self.weight_bytes
        last_params: Tensors = {}
        forward = self._stream(step, list(range(n_units)), FORWARD, wait, opening)
        del opening  # the generator has them (a future holds its result: a unit must not live on here)
        for u, params in forward:
            if u == n_units - 1:
                last_params = params
            if self.pipelined:  # keep the weights for backward: one transfer per unit per step
                resident[u] = params
            inputs.append(xs)
            kept += nbytes(xs)
            saved.append([])
            outs = []
            for k, xk in enumerate(xs):
                with dropout_scope(self.seed, step, first[k]):  # this micro-batch's global samples
                    out, s = self.model.units[u].forward(params, xk)
                size = nbytes(s)
                keep = self.budget is None or kept + size <= self.budget
                saved[u].append(s if keep else None)  # None: recompute in backward from the input
                kept += size if keep else 0
                outs.append(out)
            xs = outs
            del params  # before the stream resumes: only this unit's successor and the next-but-one alive
        order = list(reversed(range(n_units)))
        # backward's first streamed unit (the last one of forward is kept) is fetched during the loss: asked
        # for only when backward reaches it, its whole fetch was a wait every step
        ahead = None
        if not self.pipelined and n_units > 1:
            ahead = self._fetch.submit(self.units.get_unit, step, order[1], BACKWARD)
        loss = 0.0
        dys: list[np.ndarray | None] = []
        for xk, yk in zip(xs, ys, strict=True):
            part, ce = cross_entropy_forward(xk, yk, denom, in_place=True)
            loss += part
            dys.append(cross_entropy_backward(ce, xk.shape))
        del xs, ce
        pushes: deque[Future[None]] = deque()
        recomputed = 0
        if self.pipelined:
            units: Iterable[tuple[int, Tensors]] = ((u, resident.pop(u)) for u in order)
        else:  # the last unit of forward is the first of backward: keep it rather than fetch it again
            rest = self._stream(step, order[1:], BACKWARD, wait, [ahead]) if ahead is not None else iter(())
            units = _kept_then_streamed(order[0], last_params, rest)
        del last_params, ahead  # the generators hold them until backward has used them, and no longer
        for u, params in units:
            unit = self.model.units[u]
            total: Tensors = {}
            for k in range(len(dys)):
                s = saved[u][k]
                if s is None:  # recomputed under the forward's scope: the same dropout masks
                    with dropout_scope(self.seed, step, first[k]):
                        _, s = unit.forward(params, inputs[u][k])
                    recomputed += 1
                dy = dys[k]
                assert dy is not None
                dys[k], grads = unit.backward(params, s, dy)
                saved[u][k] = None
                if total:
                    accumulate_grads(total, grads)
                else:
                    total = grads
            inputs[u] = []
            if len(pushes) >= _PUSHES_IN_FLIGHT:  # back-pressure: gradients must not pile up in memory
                t0 = time.perf_counter()
                pushes.popleft().result()
                wait[0] += time.perf_counter() - t0
            pushes.append(self._push.submit(self.units.push_grads, step, u, total))
            del total, grads, params
        t0 = time.perf_counter()
        for f in pushes:
            f.result()
        wait[0] += time.perf_counter() - t0
        elapsed = time.perf_counter() - t_start
        tokens = int(np.count_nonzero(y >= 0))
        return StepOutcome(loss, tokens, elapsed - wait[0], wait[0], peak_rss_bytes(), recomputed)

    def evaluate(self, step: int, num_batches: int) -> float:
        """Sum over ``num_batches`` eval batches of this worker's share of each batch's mean loss.
        Each unit streams in once and runs over every eval batch before the next unit."""
        with self._giving_up_once_closed():
            return self._evaluate(step, num_batches)

    def _evaluate(self, step: int, num_batches: int) -> float:
        wait = [0.0]
        batches = [self.batches.get("eval", b, self.index, self.num_workers) for b in range(num_batches)]
        xs = [b[0] for b in batches]  # batches: (inputs, targets, global loss denominator) each
        for u, params in self._stream(step, list(range(len(self.model.units))), EVAL, wait):
            xs = [self.model.units[u].forward(params, x)[0] for x in xs]
            del params
        return sum(
            cross_entropy_forward(x, y, denom, in_place=True)[0]
            for x, (_, y, denom) in zip(xs, batches, strict=True)
        )


def _kept_then_streamed(
    unit: int, params: Tensors, rest: Iterator[tuple[int, Tensors]]
) -> Iterator[tuple[int, Tensors]]:
    """The unit kept from forward, then the streamed rest; lets go of the kept unit once it is used (a
    ``chain`` over a list would hold it through all of backward: one unit more in memory)."""
    yield unit, params
    del params
    yield from rest

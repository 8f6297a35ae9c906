"""The CS-2 worker's step: units stream in, forward, loss, units stream in again, backward, gradients out.

The worker holds at most two units' weights (the one computing and the next, prefetched in the
background) and its own activations. Activations: while the memory budget allows, a unit keeps what its
backward needs; past the budget it keeps only its input and recomputes its forward in backward with the
weights that stream in again anyway. So memory does not grow with the model's size, only with depth by
one input activation per unit. Who holds a unit's weights, and until when, is ``units.py``'s: the step
here only reads the unit it is lent. No gRPC here: weights and batches come through small interfaces.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from weightstream.numerics import ModelDef
from weightstream.numerics.dropout import dropout_scope
from weightstream.numerics.layers import cross_entropy_backward, cross_entropy_forward
from weightstream.numerics.model import accumulate_grads
from weightstream.transport.errors import RoleClosedError
from weightstream.worker.units import GradientPushes, LentUnit, Tensors, UnitStream, WaitClock

__all__ = ["BatchSource", "StepOutcome", "Tensors", "UnitSource", "WorkerEngine"]

FORWARD, BACKWARD, EVAL = 0, 1, 2
# A step's tensor per micro-batch as it flows: the inputs, each unit's outputs in forward, the logits, then
# in backward the gradients with respect to each unit's outputs (None past the first unit: ids have none)
Flow = list[np.ndarray | None]


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

    def _fetcher(self, step: int, phase: int) -> Callable[[int], Future[Tensors]]:
        return lambda unit: self._fetch.submit(self.units.get_unit, step, unit, phase)

    def _stream(
        self, step: int, phase: int, order: Sequence[int], clock: WaitClock, opening: int = 1, keep: int = 0
    ) -> UnitStream:
        """The units of ``order`` for one pass of step ``step``, each fetched while the one before it
        computes (see ``UnitStream``)."""
        fetch = self._fetcher(step, phase)
        return UnitStream(fetch, order, clock, self._check_open, opening=opening, keep=keep)

    def run_step(self, step: int) -> StepOutcome:
        """Forward and backward of this worker's shard of step ``step``.

        The shard runs as micro-batches: each unit, while its weights are here, runs over every
        micro-batch, and its gradient is the sum over micro-batches in order (deterministic)."""
        with self._giving_up_once_closed():
            return self._run_step(step)

    def _run_step(self, step: int) -> StepOutcome:
        t_start = time.perf_counter()
        clock = WaitClock()
        n_units = len(self.model.units)
        # the first units' weights are asked for first: at a step's start they wait for MemoryX to update
        # them, and the batch arrives meanwhile. Units 0 and 1 at once: asked for only once unit 0 was
        # here, unit 1's round trip through SwarmX and MemoryX was a wait every step (~7 ms at GPT-2
        # d512/L4, its update long done); the two are the most the stream holds anyway. The last unit of
        # forward is the first of backward: kept rather than fetched again (pipelined: every unit, one
        # transfer per unit per step)
        keep = n_units if self.pipelined else 1
        with self._stream(step, FORWARD, range(n_units), clock, opening=2, keep=keep) as forward:
            shard = self._shard(step)
            flow, saved = self._forward(forward, shard)
            # backward's first streamed unit is asked for now and arrives during the loss: asked for only
            # when backward reached it, its whole fetch was a wait every step
            backward = forward.reverse(self._fetcher(step, BACKWARD))
        with backward:
            loss = self._loss(flow, shard)
            self._backward(backward, shard, saved, flow, clock)
        elapsed = time.perf_counter() - t_start
        tokens = int(np.count_nonzero(shard.targets >= 0))
        return StepOutcome(
            loss, tokens, elapsed - clock.seconds, clock.seconds, peak_rss_bytes(), saved.recomputed
        )

    def _shard(self, step: int) -> _Shard:
        # denom: the global batch's loss denominator (counted tokens: the shard alone cannot tell them)
        x, y, denom = self.batches.get("train", step, self.index, self.num_workers)
        m = self.micro_batch or len(x)
        return _Shard(
            step=step,
            inputs=[x[i : i + m] for i in range(0, len(x), m)],  # micro-batches: [m, ...] each
            targets_by_micro=[y[i : i + m] for i in range(0, len(y), m)],
            first=[self.index * len(x) + i for i in range(0, len(x), m)],
            targets=y,
            denom=denom,
        )

    def _forward(self, units: UnitStream, shard: _Shard) -> tuple[Flow, _Saved]:
        """(the logits of each micro-batch, what backward needs of forward) of this worker's shard."""
        flow: Flow = list(shard.inputs)
        saved = _Saved(self.budget, self.weight_bytes)
        for unit in units:
            for k, x in enumerate(saved.add_inputs(flow)):
                with dropout_scope(self.seed, shard.step, shard.first[k]):  # this micro-batch's samples
                    flow[k], acts = self.model.units[unit.index].forward(unit.params, x)
                saved.add(acts)
        return flow, saved

    def _loss(self, flow: Flow, shard: _Shard) -> float:
        """This worker's share of the global mean loss; turns ``flow`` from the logits of each micro-batch
        into the loss's gradients with respect to them. The softmax, then the gradient, are written over
        the logits: no vocabulary-sized buffer of the loss's own."""
        loss = 0.0
        for k, targets in enumerate(shard.targets_by_micro):
            logits = flow[k]
            assert logits is not None
            part, ce = cross_entropy_forward(logits, targets, shard.denom, in_place=True)
            loss += part
            flow[k] = cross_entropy_backward(ce, logits.shape)
        return loss

    def _backward(
        self, units: UnitStream, shard: _Shard, saved: _Saved, flow: Flow, clock: WaitClock
    ) -> None:
        """Every unit's gradient pushed up, in ``units``' order; returns once the last one is up."""
        step = shard.step
        pushes = GradientPushes(
            lambda u, grads: self._push.submit(self.units.push_grads, step, u, grads), clock
        )
        for unit in units:
            # straight into the push: a name here would hold a unit's gradients through the next backward
            pushes.push(unit.index, self._unit_backward(unit, shard, saved, flow))
        pushes.drain()

    def _unit_backward(self, unit: LentUnit, shard: _Shard, saved: _Saved, flow: Flow) -> Tensors:
        """Gradient of ``unit``'s parameters, summed over micro-batches in order; turns ``flow`` from the
        gradients of its outputs into those of its inputs, and lets go of what forward saved for it."""
        layer = self.model.units[unit.index]
        total: Tensors = {}
        for k in range(len(flow)):
            acts = saved.take(unit.index, k)
            if acts is None:  # recomputed under the forward's scope: the same dropout masks
                acts = self._recompute(unit, shard, saved, k)
            dy = flow[k]
            assert dy is not None
            flow[k], grads = layer.backward(unit.params, acts, dy)
            if total:
                accumulate_grads(total, grads)
            else:
                total = grads
        saved.drop_inputs(unit.index)
        return total

    def _recompute(self, unit: LentUnit, shard: _Shard, saved: _Saved, micro: int) -> Any:
        """The activations of (``unit``, ``micro``) that the budget did not keep, from its kept input."""
        saved.recomputed += 1
        with dropout_scope(self.seed, shard.step, shard.first[micro]):
            return self.model.units[unit.index].forward(unit.params, saved.inputs[unit.index][micro])[1]

    def evaluate(self, step: int, num_batches: int) -> float:
        """Sum over ``num_batches`` eval batches of this worker's share of each batch's mean loss.
        Each unit streams in once and runs over every eval batch before the next unit."""
        with self._giving_up_once_closed():
            return self._evaluate(step, num_batches)

    def _evaluate(self, step: int, num_batches: int) -> float:
        batches = [self.batches.get("eval", b, self.index, self.num_workers) for b in range(num_batches)]
        xs = [b[0] for b in batches]  # batches: (inputs, targets, global loss denominator) each
        with self._stream(step, EVAL, range(len(self.model.units)), WaitClock()) as units:
            for unit in units:
                xs = [self.model.units[unit.index].forward(unit.params, x)[0] for x in xs]
        return sum(
            cross_entropy_forward(x, y, denom, in_place=True)[0]
            for x, (_, y, denom) in zip(xs, batches, strict=True)
        )


@dataclass(frozen=True)
class _Shard:
    """This worker's shard of a step's batch, in micro-batches."""

    step: int
    inputs: list[np.ndarray]  # the micro-batches' inputs: [m, ...] each
    targets_by_micro: list[np.ndarray]  # their targets; -1 is padding
    first: list[int]  # each micro-batch's row 0 as a global sample index: its dropout masks
    targets: np.ndarray  # the whole shard's
    denom: float  # the global batch's loss denominator


class _Saved:
    """What forward leaves for backward: each unit's input per micro-batch, and its activations while the
    memory budget has room for them (past it, None: backward recomputes them from the input). The budget
    counts the weights first, then inputs and activations in the order forward makes them."""

    def __init__(self, budget: int | None, weight_bytes: int) -> None:
        self.inputs: list[list[np.ndarray]] = []  # [unit][micro-batch]
        self._acts: list[list[Any]] = []  # [unit][micro-batch]; None: to be recomputed
        self._budget, self._bytes = budget, weight_bytes
        self.recomputed = 0  # (unit, micro-batch) pairs backward recomputed

    def add_inputs(self, xs: Flow) -> list[np.ndarray]:
        """The next unit's inputs, one per micro-batch (always kept: recompute starts from them)."""
        self.inputs.append(cast(list[np.ndarray], list(xs)))  # forward's flow holds no None
        self._acts.append([])
        self._bytes += nbytes(self.inputs[-1])
        return self.inputs[-1]

    def add(self, acts: Any) -> None:
        """The next micro-batch's activations of the unit whose inputs came last, if the budget allows."""
        size = nbytes(acts)
        keep = self._budget is None or self._bytes + size <= self._budget
        self._acts[-1].append(acts if keep else None)
        self._bytes += size if keep else 0

    def take(self, unit: int, micro: int) -> Any:
        """The activations kept of (``unit``, ``micro``), let go of here; None: recompute them."""
        acts, self._acts[unit][micro] = self._acts[unit][micro], None
        return acts

    def drop_inputs(self, unit: int) -> None:
        self.inputs[unit] = []

"""The coordinator's typed clients of the roles it drives: one per role kind, each call made to every role
of the kind at once.

``MemoryXClient`` and ``WorkerClient`` name every call the coordinator makes of them
(``memoryx.apply_update(step, lr, clip)``), with typed parameters and replies in role order. What every
call shares is the role plane's (``RolePlane.all``, handed in as ``FanOut``): the calls run concurrently,
each with the job's deadline (``timeout_s``); a failed call is a ``PeerError`` naming the role and the
call, raised as ``RoleFault`` at once, as is (with ``watch``) any role of the job dying meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from weightstream.plan import REPLICA
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.rpc import call

__all__ = ["FanOut", "MemoryXClient", "WorkerClient"]

T = TypeVar("T")
S = TypeVar("S")


class FanOut(Protocol):
    """``RolePlane.all``: ``fn(i)`` for every role ``i`` of ``kind`` at once, within ``timeout_s``."""

    def __call__(
        self,
        kind: str,
        fn: Callable[[int], T],
        timeout_s: float,
        watch: bool = True,
        count: int | None = None,
    ) -> list[T]: ...


class _Kind(Generic[S]):
    """Every role of one kind, through its generated stubs (one per role, in role order)."""

    kind = ""

    def __init__(self, stubs: Sequence[S], fan_out: FanOut, timeout_s: float) -> None:
        self._stubs, self._fan_out, self.timeout_s = list(stubs), fan_out, timeout_s

    def _all(
        self,
        name: str,
        method: Callable[[S], Callable[..., Any]],
        request: Any,
        watch: bool,
        also: Sequence[tuple[str, S]] = (),
    ) -> list[Any]:
        """``method(stub)(request)`` on every role, each named ``<kind>-<i>`` and ``name`` in its errors;
        ``also``: more roles to call at the same time, as (name, stub), their replies after the kind's."""
        named = [(f"{self.kind}-{i}", stub) for i, stub in enumerate(self._stubs)] + list(also)

        def one(i: int) -> Any:
            peer, stub = named[i]
            return call(peer, name, method(stub), request, timeout=self.timeout_s)

        return self._fan_out(self.kind, one, self.timeout_s, watch, count=len(named))


class MemoryXClient(_Kind[rpc.MemoryXStub]):
    """Every MemoryX shard of the current configuration, and each shard's replica where the job keeps
    them (``replicas``, in shard order): a replica is sent every update its shard is, at the same time, and
    nothing else."""

    kind = "memoryx"

    def __init__(
        self,
        stubs: Sequence[rpc.MemoryXStub],
        fan_out: FanOut,
        timeout_s: float,
        replicas: Sequence[rpc.MemoryXStub] = (),
    ) -> None:
        super().__init__(stubs, fan_out, timeout_s)
        self._replicas = [(f"{REPLICA}-{i}", stub) for i, stub in enumerate(replicas)]

    def grad_norm_sq(self, step: int) -> list[float]:
        """Each shard's sum of squares of step ``step``'s gradients; a shard answers once they are all in."""
        replies: list[pb.NormReply] = self._all(
            "GradNormSq", lambda s: s.GradNormSq, pb.StepRequest(step=step), watch=True
        )
        return [r.sq_sum for r in replies]

    def apply_update(self, step: int, lr: float, clip: float, *, watch: bool = True) -> None:
        """Apply step ``step``'s update with learning rate ``lr`` and gradient clipping coefficient ``clip``
        on every shard (idempotent: a shard that has applied it says so and changes nothing)."""
        request = pb.UpdateRequest(step=step, learning_rate=lr, clip_coef=clip)
        self._all("ApplyUpdate", lambda s: s.ApplyUpdate, request, watch, also=self._replicas)

    def save_checkpoint(self, step: int, directory: str, weights_only: bool) -> list[pb.CheckpointReply]:
        """Every shard writes its files of step ``step`` into ``directory`` (optimizer state too, unless
        ``weights_only``); the replies name each shard's files and the tensors in them."""
        request = pb.CheckpointRequest(step=step, directory=directory, weights_only=weights_only)
        replies: list[pb.CheckpointReply] = self._all(
            "SaveCheckpoint", lambda s: s.SaveCheckpoint, request, watch=True
        )
        return replies


class WorkerClient(_Kind[rpc.WorkerStub]):
    """Every CS-2 worker of the current configuration."""

    kind = "worker"

    def run_step(self, step: int) -> list[pb.RunStepReply]:
        """Train step ``step`` (forward, backward, gradients pushed); each worker's loss share and times."""
        replies: list[pb.RunStepReply] = self._all(
            "RunStep", lambda s: s.RunStep, pb.RunStepRequest(step=step), watch=True
        )
        return replies

    def evaluate(self, step: int, num_batches: int) -> list[float]:
        """Each worker's share of the eval loss of the weights after ``step`` updates, summed over
        ``num_batches`` eval batches."""
        request = pb.EvalRequest(step=step, batch=num_batches)
        replies: list[pb.EvalReply] = self._all("Evaluate", lambda s: s.Evaluate, request, watch=True)
        return [r.loss for r in replies]

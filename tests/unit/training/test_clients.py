"""The coordinator's typed role clients (training/clients.py) against recording stubs: each method sends its
request to every role of its kind with the job's deadline and returns the replies in role order; the
fan-out is the role plane's, so a failed call is a RoleFault naming the role and the call, and only
ApplyUpdate may be told not to watch for dying roles."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.clients import MemoryXClient, WorkerClient
from weightstream.training.errors import RoleFault
from weightstream.training.roles import RolePlane

T = TypeVar("T")
DEADLINE_S = 7.5


class Failed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class Stub:
    """A generated stub's stand-in for role ``index``: each method records (method, request, deadline)
    and answers what ``answer(method, index)`` gives (an RpcError is raised)."""

    def __init__(self, index: int, calls: list[tuple[str, int, Any, float]], answer: Callable[..., Any]):
        self.index, self._calls, self._answer = index, calls, answer
        self._lock = threading.Lock()

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def unary(request: Any, timeout: float) -> Any:
            with self._lock:
                self._calls.append((method, self.index, request, timeout))
            reply = self._answer(method, self.index)
            if isinstance(reply, grpc.RpcError):
                raise reply
            return reply

        return unary


def _stubs(n: int, calls: list[tuple[str, int, Any, float]], answer: Callable[..., Any]) -> list[Any]:
    """``n`` Stubs, where a client takes the generated stubs they stand in for."""
    return [Stub(i, calls, answer) for i in range(n)]


class FanOut:
    """``RolePlane.all``'s stand-in: runs ``fn(i)`` for every stub in order; records (kind, deadline,
    watch) of each fan-out."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: list[tuple[str, float, bool]] = []

    def __call__(
        self,
        kind: str,
        fn: Callable[[int], T],
        timeout_s: float,
        watch: bool = True,
        count: int | None = None,
    ) -> list[T]:
        self.seen.append((kind, timeout_s, watch))
        return [fn(i) for i in range(self.n if count is None else count)]


def _answer(method: str, i: int) -> Any:
    return {
        "GradNormSq": pb.NormReply(sq_sum=float(i + 1)),
        "ApplyUpdate": pb.Ack(message="applied"),
        "SaveCheckpoint": pb.CheckpointReply(model_files=[pb.CheckpointFile(name=f"m{i}", tensors=["w"])]),
        "RunStep": pb.RunStepReply(loss=0.5 * i, tokens=16),
        "Evaluate": pb.EvalReply(loss=0.25 * i),
    }[method]


def test_memoryx_calls_reach_every_shard_with_the_deadline_and_reply_in_shard_order() -> None:
    calls: list[tuple[str, int, Any, float]] = []
    fan_out = FanOut(3)
    memoryx = MemoryXClient(_stubs(3, calls, _answer), fan_out, DEADLINE_S)
    assert memoryx.grad_norm_sq(4) == [1.0, 2.0, 3.0]
    memoryx.apply_update(4, 1e-3, 0.5, watch=False)
    replies = memoryx.save_checkpoint(5, "/ckpt/tmp", weights_only=True)
    assert [r.model_files[0].name for r in replies] == ["m0", "m1", "m2"]
    assert [(m, i, t) for m, i, _, t in calls] == [
        (m, i, DEADLINE_S) for m in ("GradNormSq", "ApplyUpdate", "SaveCheckpoint") for i in range(3)
    ]
    requests = {m: r for m, _, r, _ in calls}
    assert requests["GradNormSq"] == pb.StepRequest(step=4)
    assert requests["ApplyUpdate"] == pb.UpdateRequest(step=4, learning_rate=1e-3, clip_coef=0.5)
    assert requests["SaveCheckpoint"] == pb.CheckpointRequest(
        step=5, directory="/ckpt/tmp", weights_only=True
    )
    # every call watches for dying roles, but an update told not to
    assert [watch for _, _, watch in fan_out.seen] == [True, False, True]
    assert {(kind, deadline) for kind, deadline, _ in fan_out.seen} == {("memoryx", DEADLINE_S)}


def test_replicas_get_every_update_and_nothing_else() -> None:
    calls: list[tuple[str, int, Any, float]] = []
    replica_calls: list[tuple[str, int, Any, float]] = []
    replicas = _stubs(2, replica_calls, _answer)
    memoryx = MemoryXClient(_stubs(2, calls, _answer), FanOut(2), DEADLINE_S, replicas)
    assert memoryx.grad_norm_sq(4) == [1.0, 2.0]  # the shards' own
    memoryx.apply_update(4, 1e-3, 0.5)
    memoryx.save_checkpoint(5, "/ckpt/tmp", weights_only=False)
    assert [(m, i) for m, i, _, _ in calls] == [
        (m, i) for m in ("GradNormSq", "ApplyUpdate", "SaveCheckpoint") for i in range(2)
    ]
    update = pb.UpdateRequest(step=4, learning_rate=1e-3, clip_coef=0.5)
    assert [(m, i, r) for m, i, r, _ in replica_calls] == [("ApplyUpdate", i, update) for i in range(2)]


def test_worker_calls_reach_every_worker_with_the_deadline_and_reply_in_worker_order() -> None:
    calls: list[tuple[str, int, Any, float]] = []
    fan_out = FanOut(2)
    workers = WorkerClient(_stubs(2, calls, _answer), fan_out, DEADLINE_S)
    assert [r.loss for r in workers.run_step(9)] == [0.0, 0.5]
    assert workers.evaluate(10, num_batches=3) == [0.0, 0.25]
    assert [(m, i, r, t) for m, i, r, t in calls] == [
        ("RunStep", 0, pb.RunStepRequest(step=9), DEADLINE_S),
        ("RunStep", 1, pb.RunStepRequest(step=9), DEADLINE_S),
        ("Evaluate", 0, pb.EvalRequest(step=10, batch=3), DEADLINE_S),
        ("Evaluate", 1, pb.EvalRequest(step=10, batch=3), DEADLINE_S),
    ]
    assert fan_out.seen == [("worker", DEADLINE_S, True)] * 2


class NoFailures:
    def failures(self) -> list[str]:
        return []


class Counts:
    def counts(self) -> dict[str, int]:
        return {"memoryx": 2, "worker": 1, "swarmx": 1, "activation": 1}


def test_a_failed_call_is_a_role_fault_naming_the_role_and_the_call() -> None:
    """Through the plane's own fan-out: the failure of shard 1's ApplyUpdate, as gRPC reports it."""
    plane = RolePlane(NoFailures(), Counts(), {"runconfig": {}}, "job", "t" * 64, DEADLINE_S)  # type: ignore[arg-type]
    try:
        answer = lambda m, i: Failed() if i == 1 else _answer(m, i)  # noqa: E731
        plane.memoryx = MemoryXClient(_stubs(2, [], answer), plane.all, DEADLINE_S)
        with pytest.raises(
            RoleFault, match=r"^ApplyUpdate to memoryx-1 failed: UNAVAILABLE: connection refused$"
        ):
            plane.memoryx.apply_update(3, 1e-3, 1.0, watch=False)
    finally:
        plane.close()

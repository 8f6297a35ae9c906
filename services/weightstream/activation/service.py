"""The activation server: reads the data and hands each worker its shard of a step's global batch."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np

from weightstream.data import DataProcessor, make_data_processor
from weightstream.data.loss_scaling import NUM_TOKENS, LossScaling, loss_denominator, loss_scaling
from weightstream.params import load_params
from weightstream.plan import JobSpec
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import RoleHost
from weightstream.transport.rpc import abort_on_error
from weightstream.transport.servicers import register_servicer
from weightstream.transport.tensors import tensor_messages

__all__ = ["ActivationServer", "add_servicer", "build", "reconfigure"]


class ActivationServer:
    def __init__(
        self, train: DataProcessor, eval_: DataProcessor | None, scaling: LossScaling = NUM_TOKENS
    ) -> None:
        self.splits = {"train": train, **({"eval": eval_} if eval_ is not None else {})}
        self.scaling = scaling

    def batch(
        self, split: str, step: int, worker: int, num_workers: int
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(inputs, targets, the loss's denominator for the whole global batch) of worker ``worker``'s
        shard: the counted targets of the global batch (or batch_size / loss_weight, see
        ``data.loss_scaling``), which the worker cannot tell from its shard alone."""
        if split not in self.splits:
            raise ValueError(f"no {split!r} data (have: {', '.join(self.splits)})")
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} out of range for {num_workers} workers")
        data = self.splits[split]
        x, y = data.shard(step, worker, num_workers)
        return x, y, loss_denominator(data, step, self.scaling)


def build(job: JobSpec) -> ActivationServer:
    p = load_params(job.params)
    train = make_data_processor(p.train_input, p.model, "train")
    return ActivationServer(
        train,
        make_data_processor(p.eval_input, p.model, "eval") if p.eval_input else None,
        loss_scaling(p.model),
    )


def reconfigure(server: ActivationServer, job: JobSpec) -> ActivationServer:
    """Kept as it is when the job is reconfigured after a fault: a batch depends only on the step and
    the data, so there is nothing of an interrupted attempt to forget (and no data to read again)."""
    return server


class ActivationServicer(rpc.ActivationServicer):
    """Only translates messages; ``ActivationServer`` does the work. Batches go as a tensor stream, raw
    bytes (``register_servicer``)."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def GetBatch(self, request: pb.BatchRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        server: ActivationServer = self.host.logic(context)
        try:
            x, y, denom = server.batch(request.split, request.step, request.worker, request.num_workers)
        except Exception as e:
            abort_on_error(context, e)
        yield from tensor_messages(
            # float64: batch_size / loss_weight is no integer, and a count is exact in it up to 2**53
            [("inputs", x), ("targets", y), ("denom", np.array([denom], dtype=np.float64))]
        )


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    register_servicer(rpc.add_ActivationServicer_to_server, ActivationServicer(host), server)

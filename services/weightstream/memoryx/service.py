"""MemoryX over gRPC: a thin servicer that only converts messages; the logic is ``MemoryXShard``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc

from weightstream.checkpoint_layout import confine_checkpoint, shard_file_name
from weightstream.memoryx.shard import MemoryXShard
from weightstream.memoryx.storage import write_safetensors
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.plan import JobSpec, Plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import RoleHost
from weightstream.transport.fencing import generation_of
from weightstream.transport.rpc import (
    abort_on_error,
    add_service,
    receive_tensors,
    tensors_in,
    tensors_out,
    unary,
)
from weightstream.transport.tensors import tensor_messages

__all__ = ["MemoryXServicer", "add_servicer", "build", "reconfigure"]

log = logging.getLogger("weightstream.memoryx")


def build(job: JobSpec) -> MemoryXShard:
    params = load_params(job.params)
    model = model_def(params)
    plan = Plan.from_dict(job.plan)
    names = [n for n in model.specs if plan.tensor_shard[n] == job.index]
    model_dir = params.runconfig.model_dir
    resume = str(confine_checkpoint(model_dir, job.resume_dir)) if job.resume_dir is not None else None
    return MemoryXShard(
        model,
        optimizer_config(params.optimizer),
        names,
        params.runconfig.seed,
        params.runconfig.rpc_timeout_s,
        resume,
        generation=job.generation,
    )


def reconfigure(shard: MemoryXShard, job: JobSpec) -> MemoryXShard | None:
    """After a fault elsewhere, a surviving shard keeps its weights and state (``job.keep_state``) and only
    forgets the interrupted step; otherwise (a MemoryX shard was lost, so all roll back together) it is
    built again from ``job.resume_dir``, the coordinator's recovery point."""
    if not job.keep_state:
        return None
    shard.reset(job.generation)
    return shard


def checkpoint_files(job: JobSpec, request: pb.CheckpointRequest) -> tuple[Path, Path]:
    """Where this shard writes its model and optimizer files for ``request``: only inside the job's own
    partial checkpoint directory, under the names its index gives; any other request is refused."""
    rc = job.params["runconfig"]
    directory = confine_checkpoint(rc["model_dir"], request.directory, request.step)
    k = rc["num_wgt_servers"]
    files = shard_file_name("model", job.index, k), shard_file_name("optimizer", job.index, k)
    if (request.model_file, request.optimizer_file) != files:
        raise PermissionError(f"shard {job.index} of {k} writes {files[0]} and {files[1]}, nothing else")
    return directory / files[0], directory / files[1]


class MemoryXServicer:
    """Only translates messages; ``MemoryXShard`` does the work."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def _shard(self, context: grpc.ServicerContext) -> MemoryXShard:
        return self.host.logic(context)

    def GetTensors(self, request: pb.TensorRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        shard = self._shard(context)
        try:
            tensors = shard.tensors(request.step, list(request.names))
            bf16 = self.host.job is not None and self.host.job.params["model"].get("fp16_type") == "bfloat16"
            crcs = None if bf16 else shard.checksums(list(request.names))
        except Exception as e:
            abort_on_error(context, e)
        yield from tensor_messages(tensors, bf16=bf16, crcs=crcs)

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        shard = self._shard(context)
        gen = generation_of(context.invocation_metadata())
        return receive_tensors(
            context, request_iterator, lambda h, g: shard.add_gradient(h.step, h.unit, g, gen)
        )

    def GradNormSq(self, request: pb.StepRequest, context: grpc.ServicerContext) -> pb.NormReply:
        try:
            gen = generation_of(context.invocation_metadata())
            return pb.NormReply(sq_sum=self._shard(context).grad_sq_sum(request.step, gen))
        except Exception as e:
            abort_on_error(context, e)
            raise

    def ApplyUpdate(self, request: pb.UpdateRequest, context: grpc.ServicerContext) -> pb.Ack:
        try:
            applied = self._shard(context).apply_update(
                request.step,
                request.learning_rate,
                request.clip_coef,
                generation_of(context.invocation_metadata()),
            )
        except Exception as e:
            abort_on_error(context, e)
            raise
        return pb.Ack(message="applied" if applied else "already applied")

    def SaveCheckpoint(
        self, request: pb.CheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CheckpointReply:
        shard = self._shard(context)
        try:
            assert self.host.job is not None  # configured: _shard() aborts otherwise
            model_path, optimizer_path = checkpoint_files(self.host.job, request)
            weights, state, step = shard.snapshot()
            if step != request.step:
                raise ValueError(f"checkpoint of step {request.step} requested, shard is at step {step}")
            write_safetensors(model_path, weights)
            write_safetensors(optimizer_path, state)
        except Exception as e:
            abort_on_error(context, e)
        return pb.CheckpointReply(tensor_names=list(weights), state_names=list(state))


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    s = MemoryXServicer(host)
    add_service(
        server,
        "MemoryX",
        {
            "GetTensors": tensors_out(s.GetTensors, pb.TensorRequest),
            "PushGradients": tensors_in(s.PushGradients, pb.Ack),
            "GradNormSq": unary(s.GradNormSq, pb.StepRequest, pb.NormReply),
            "ApplyUpdate": unary(s.ApplyUpdate, pb.UpdateRequest, pb.Ack),
            "SaveCheckpoint": unary(s.SaveCheckpoint, pb.CheckpointRequest, pb.CheckpointReply),
        },
    )

"""MemoryX over gRPC: a thin servicer that only converts messages; the logic is ``MemoryXShard``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np

from weightstream.checkpoint_layout import MASKS, checkpoint_files, confine_checkpoint
from weightstream.memoryx.shard import MemoryXShard
from weightstream.numerics.optim import state_names
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import sparsity_specs
from weightstream.plan import JobSpec, Plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import RoleHost, shm_tag
from weightstream.transport.fencing import generation_of
from weightstream.transport.plane import SHARED_MEMORY, DataPlane, SharedMemoryPlane, plane_of_call
from weightstream.transport.rpc import abort_on_error, receive_tensors
from weightstream.transport.servicers import register_servicer
from weightstream.transport.shm import SharedArena

__all__ = ["MemoryXServicer", "add_servicer", "build", "reconfigure"]

log = logging.getLogger("weightstream.memoryx")


def build(job: JobSpec) -> MemoryXShard:
    params = load_params(job.params)
    model = model_def(params)
    plan = Plan.from_dict(job.plan)
    names = [n for n in model.specs if plan.tensor_shard[n] == job.index]
    rc = params.runconfig
    resume = str(confine_checkpoint(rc.model_dir, job.resume_dir)) if job.resume_dir is not None else None
    # no checkpoint of the run's own: the weights of a Hugging Face model, if the params name one
    storage = (
        storage_dir(rc.model_dir, rc.memoryx_dir, job.index, job.generation if job.replica else None)
        if rc.memoryx_storage == "disk"
        else None
    )
    if storage is not None:
        log.info("shard %d keeps its tensors in %s", job.index, storage)
        try:
            storage.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"runconfig.memoryx_dir: cannot make {storage.parent}: {e.strerror}") from e
    # memory mode on the shared-memory plane: the weights live in memfds the workers map (no copies)
    tag = shm_tag(job)
    arena = SharedArena(tag) if tag is not None and storage is None else None
    return MemoryXShard(
        model,
        optimizer_config(params.optimizer),
        names,
        rc.seed,
        rc.rpc_timeout_s,
        resume,
        storage_dir=storage,
        generation=job.generation,
        arena=arena,
        sparsity=sparsity_specs(params, model),
        init_dir=rc.checkpoint_path if resume is None else None,
    )


def storage_dir(model_dir: str, memoryx_dir: str | None, index: int, replica_of: int | None = None) -> Path:
    """Shard ``index``'s own directory for disk mode: under ``memoryx_dir`` (relative paths are taken from
    ``model_dir``; default ``model_dir/.memoryx``). A replica built at generation ``replica_of`` has one of
    its own beside it: the shard's two processes each keep their files, and after a fault the replica that
    took the shard's place keeps its directory while a new replica is built in another."""
    base = Path(model_dir) / (memoryx_dir if memoryx_dir is not None else ".memoryx")
    return base / (f"shard_{index}" if replica_of is None else f"shard_{index}.replica-{replica_of}")


def reconfigure(shard: MemoryXShard, job: JobSpec) -> MemoryXShard | None:
    """After a fault elsewhere, a surviving shard keeps its weights and state (``job.keep_state``) and only
    forgets the interrupted step; otherwise (a MemoryX shard was lost, so all roll back together) it is
    built again from ``job.resume_dir``, the coordinator's recovery point."""
    if not job.keep_state:
        return None
    shard.reset(job.generation)
    return shard


def shard_checkpoint_files(job: JobSpec, weights_only: bool) -> dict[str, list[tuple[str, list[str]]]]:
    """This shard's files of "model" (and "optimizer", unless ``weights_only``; and the sparse tensors'
    masks, if any) and the tensors in each, as every shard and the coordinator compute them from the params
    (``checkpoint_layout.checkpoint_files``)."""
    params = load_params(job.params)
    model = model_def(params)
    plan = Plan.from_dict(job.plan)
    suffixes: dict[str, tuple[list[str], int, list[str]]] = {"model": ([""], 4, list(model.specs))}
    if not weights_only:
        ends = [f".{s}" for s in state_names(params.optimizer.optimizer_type)]
        suffixes["optimizer"] = (ends, 4, list(model.specs))
    sparse = list(sparsity_specs(params, model))
    if sparse:
        suffixes[MASKS] = ([""], 1, sparse)  # bool: one byte per entry
    out = {}
    for prefix, (ends, itemsize, names) in suffixes.items():
        shards: list[list[tuple[str, int]]] = [[] for _ in range(params.runconfig.num_wgt_servers)]
        for n in names:
            numel = model.specs[n].numel
            shards[plan.tensor_shard[n]].extend((n + end, itemsize * numel) for end in ends)
        out[prefix] = checkpoint_files(prefix, shards, params.runconfig.checkpoint_max_shard_size)[job.index]
    return out


class MemoryXServicer(rpc.MemoryXServicer):
    """Only translates messages; ``MemoryXShard`` does the work. Tensor streams are raw bytes
    (``register_servicer``)."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host
        self._shared: tuple[MemoryXShard, SharedMemoryPlane | None] | None = None

    def _shard(self, context: grpc.ServicerContext) -> MemoryXShard:
        return self.host.logic(context)

    def _plane(self, shard: MemoryXShard, context: grpc.ServicerContext) -> DataPlane:
        """The data plane the caller chose for the pair (shared memory only where the job may use it)."""
        shared = self._shared
        if shared is None or shared[0] is not shard:  # one plane per shard logic: it holds the mappings
            tag = shm_tag(self.host.job)
            plane = SharedMemoryPlane(tag, maps=shard.grad_maps) if tag is not None else None
            shared = self._shared = (shard, plane)
        return plane_of_call(context.invocation_metadata(), shared[1])

    def GetTensors(self, request: pb.TensorRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        shard = self._shard(context)
        try:
            tensors = shard.tensors(request.step, list(request.names))
            bf16 = self.host.job is not None and self.host.job.params["model"].get("fp16_type") == "bfloat16"
            sums = None if bf16 else shard.checksums(tensors)
            plane = self._plane(shard, context)
            # weights in memfds travel by reference; bfloat16 needs a converted copy: over gRPC then
            if plane.kind == SHARED_MEMORY and not (shard.shares_weights and not bf16):
                plane = plane_of_call(None, None)
        except Exception as e:
            abort_on_error(context, e)
        yield from plane.stream(tensors, bf16=bf16, checksums=sums)

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        shard = self._shard(context)
        gen = generation_of(context.invocation_metadata())
        replica = self.host.job is not None and self.host.job.replica

        def add(h: pb.StreamHead, g: dict[str, np.ndarray]) -> None:
            if replica:
                # a replica copies what it is sent: a sender may write its shared-memory buffers again once
                # the shard's update is done (``shm.KeptScratch``), and nothing waits for the replica's
                g = {n: np.array(a, dtype=np.float32) for n, a in g.items()}
            shard.add_gradient(h.step, h.unit, g, gen)

        return receive_tensors(context, request_iterator, add, self._plane(shard, context))

    def PushGradientsOne(self, request: bytes, context: grpc.ServicerContext) -> pb.Ack:
        """A push that is one message (``transport.rpc.TensorPush``), read as a stream of one."""
        return self.PushGradients(iter((request,)), context)

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
            job = self.host.job
            assert job is not None  # configured: _shard() aborts otherwise
            # only inside the job's own partial checkpoint directory, under names the layout gives
            directory = confine_checkpoint(
                job.params["runconfig"]["model_dir"], request.directory, request.step
            )
            files = shard_checkpoint_files(job, request.weights_only)
            model, optimizer, masks = files["model"], files.get("optimizer", []), files.get(MASKS, [])
            shard.write_checkpoint(
                request.step,
                [(directory / f, names) for f, names in model],
                [(directory / f, names) for f, names in optimizer],
                [(directory / f, names) for f, names in masks],
            )
        except Exception as e:
            abort_on_error(context, e)
        return pb.CheckpointReply(
            model_files=[pb.CheckpointFile(name=f, tensors=names) for f, names in model],
            optimizer_files=[pb.CheckpointFile(name=f, tensors=names) for f, names in optimizer],
            mask_files=[pb.CheckpointFile(name=f, tensors=names) for f, names in masks],
        )


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    register_servicer(rpc.add_MemoryXServicer_to_server, MemoryXServicer(host), server)

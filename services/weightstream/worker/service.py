"""The CS-2 worker over gRPC: the servicer, and the clients for its SwarmX parent and activation server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import cast

import grpc
import numpy as np

from weightstream.numerics import ModelDef
from weightstream.numerics._gemm import engine as gemm_engine
from weightstream.params import Params, load_params, model_def
from weightstream.plan import JobSpec, Plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import RoleHost, shm_tag
from weightstream.transport.bulk import host_of_address
from weightstream.transport.peers import plane_for_peer
from weightstream.transport.plane import DataPlane, NetworkPlane, SharedMemoryPlane
from weightstream.transport.rpc import (
    abort_on_error,
    call,
    open_channel,
    push_tensors,
    stream,
    tensors_in_client,
    tensors_out_client,
)
from weightstream.transport.servicers import register_servicer
from weightstream.transport.shm import KEPT_GRADIENT_BYTES
from weightstream.transport.tensors import read_messages, wire_nbytes
from weightstream.worker.engine import Tensors, WorkerEngine
from weightstream.worker.memory import choose_micro_batch, profile
from weightstream.worker.sparse import SparseAssembler

__all__ = ["ActivationClient", "SwarmParent", "WorkerServicer", "add_servicer", "build", "plan_memory"]

log = logging.getLogger("weightstream.worker")


class SwarmParent:
    """Weights from, and gradients to, this worker's SwarmX node (where it is child ``slot``)."""

    def __init__(
        self,
        address: str,
        name: str,
        slot: int,
        timeout_s: float,
        bf16: bool,
        token: str,
        generation: int,
        plane: DataPlane | None = None,
        assemble: Callable[[Tensors], Mapping[str, object]] | None = None,
    ) -> None:
        """``plane``: the data plane of this worker and its node (transport/peers.py; the network where not
        given): on shared memory, weights are mapped from MemoryX and gradients leave in memfds.
        ``assemble``: turns what arrives into what the units take (sparse weights: ``SparseAssembler``)."""
        self.plane, self.assemble = plane if plane is not None else NetworkPlane(), assemble
        channel = open_channel(address, token, generation, self.plane.kind)
        self._get = tensors_out_client(channel, "SwarmX", "GetUnit", pb.UnitRequest)
        self._push = tensors_in_client(channel, "SwarmX", "PushGradients", pb.Ack)
        self.peer, self.slot, self.timeout_s, self.bf16 = f"{name} ({address})", slot, timeout_s, bf16
        self.host = host_of_address(address)  # where the node's bulk transfers are fetched
        self.wire_bytes = 0  # tensor bytes received and sent so far, as they travel (bf16: 2 per value)
        self._count = threading.Lock()  # the prefetch and push threads both count

    def get_unit(self, step: int, unit: int, phase: int) -> Tensors:
        req = pb.UnitRequest(step=step, unit=unit, phase=phase)
        it = call(self.peer, "GetUnit", self._get, req, timeout=self.timeout_s)
        tensors = self.plane.read(stream(self.peer, "GetUnit", it), peer=self.host)[1]
        self._counted(tensors.values())
        if self.assemble is None:
            return tensors
        # a SparseWeight stands where its dense array would: the numerics take either
        return cast(Tensors, self.assemble(tensors))

    def _counted(self, arrays: Iterable[np.ndarray]) -> None:
        """Add the bytes ``arrays`` take on the wire (float32 travels as bfloat16 in a bf16 job)."""
        n = sum(wire_nbytes(a, self.bf16) for a in arrays)
        with self._count:
            self.wire_bytes += n

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        self._counted(grads.values())
        head = pb.StreamHead(step=step, unit=unit, sender=self.slot)
        push_tensors(
            self.peer,
            self._push,
            grads.items(),
            head,
            plane=self.plane,
            bf16=self.bf16,
            timeout=self.timeout_s,
        )


class ActivationClient:
    def __init__(self, address: str, name: str, timeout_s: float, token: str, generation: int) -> None:
        channel = open_channel(address, token, generation)
        self._get = tensors_out_client(channel, "Activation", "GetBatch", pb.BatchRequest)
        self.peer, self.timeout_s = f"{name} ({address})", timeout_s

    def get(
        self, split: str, step: int, worker: int, num_workers: int
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(inputs, targets, the global batch's loss denominator): the engine's BatchSource."""
        req = pb.BatchRequest(split=split, step=step, worker=worker, num_workers=num_workers)
        it = call(self.peer, "GetBatch", self._get, req, timeout=self.timeout_s)
        t = read_messages(stream(self.peer, "GetBatch", it))[1]
        return t["inputs"], t["targets"], float(t["denom"][0])


def build(job: JobSpec) -> WorkerEngine:
    params = load_params(job.params)
    plan = Plan.from_dict(job.plan)
    rc = params.runconfig
    parent = plan.worker_parent[job.index]
    act = plan.worker_activation(job.index)
    model = model_def(params)
    address, name = job.addresses["swarmx"][parent], f"swarmx-{parent}"

    def shared() -> SharedMemoryPlane:
        assert tag is not None  # plane_for_peer asks for this plane only in a job with a memfd tag
        # a memory budget bounds what the worker holds: kept gradient memfds and kept mappings of the
        # weights (every weight's pages, as they count in its resident memory) would stay outside it
        unbounded = rc.worker_memory_mb is None
        return SharedMemoryPlane(
            tag,
            kept_bytes=KEPT_GRADIENT_BYTES[rc.memoryx_storage] if unbounded else 0,
            kept_mappings=2 * len(model.specs) if unbounded else 0,  # weights and sparse indexes
        )

    tag = shm_tag(job)
    units = SwarmParent(
        address,
        name,
        plan.child_slot("worker", job.index),
        rc.rpc_timeout_s,
        params.model.fp16_type == "bfloat16",
        job.credential,
        job.generation,
        plane_for_peer(name, address, job.credential, tag, shared),
        SparseAssembler(model) if params.sparsity is not None else None,
    )
    address, name = job.addresses["activation"][act], f"activation-{act}"
    batches = ActivationClient(address, name, rc.rpc_timeout_s, job.credential, job.generation)
    budget = rc.worker_memory_mb * (1 << 20) if rc.worker_memory_mb else None
    micro, pipelined = plan_memory(params, model, plan.num_csx, budget)
    # loads the engine now: a bad WEIGHTSTREAM_GEMM fails the configuration, not the first step
    log.info("worker %d: matrix products on %s", job.index, gemm_engine())
    return WorkerEngine(
        model, job.index, plan.num_csx, units, batches, budget, micro, pipelined, seed=rc.seed
    )


def plan_memory(
    params: Params, model: ModelDef, num_workers: int, budget: int | None
) -> tuple[int | None, bool]:
    """(micro-batch size, pipelined?) for this job's workers, from the params and the memory budget."""
    rc, inp = params.runconfig, params.train_input
    shard = inp.batch_size // num_workers
    model_bytes = model.num_params * 4
    pipelined = rc.execution_mode == "pipelined" or (
        rc.execution_mode == "auto" and budget is not None and model_bytes < budget // 2
    )
    if inp.micro_batch_size is not None or budget is None:
        return inp.micro_batch_size, pipelined
    sample = np.zeros((1, inp.max_sequence_length), np.int64) if inp.max_sequence_length else None
    if sample is None:
        sample = np.zeros((1, model.specs[model.units[0].param_names[0]].shape[0]), np.float32)
    prof = profile(model, sample)
    return choose_micro_batch(prof, shard, budget - (model_bytes if pipelined else 0)), pipelined


class WorkerServicer(rpc.WorkerServicer):
    def __init__(self, host: RoleHost) -> None:
        self.host = host
        self._memory_report: tuple[int | None, int] | None = None  # last (micro-batch, recomputed) logged

    def RunStep(self, request: pb.RunStepRequest, context: grpc.ServicerContext) -> pb.RunStepReply:
        engine: WorkerEngine = self.host.logic(context)
        before = getattr(engine.units, "wire_bytes", 0)
        try:
            r = engine.run_step(request.step)
        except Exception as e:
            abort_on_error(context, e)
            raise
        report = (engine.micro_batch, r.recomputed_units)
        if report != self._memory_report:  # the same every step in practice: logged once, not per step
            self._memory_report = report
            log.info(
                "step %d: micro-batch %s, %d unit forward passes recomputed in backward",
                request.step,
                engine.micro_batch or "of the whole shard",
                r.recomputed_units,
            )
        return pb.RunStepReply(
            loss=r.loss,
            tokens=r.tokens,
            compute_s=r.compute_s,
            wait_s=r.wait_s,
            peak_rss_bytes=r.peak_rss_bytes,
            wire_bytes=getattr(engine.units, "wire_bytes", 0) - before,
        )

    def Evaluate(self, request: pb.EvalRequest, context: grpc.ServicerContext) -> pb.EvalReply:
        engine: WorkerEngine = self.host.logic(context)
        try:
            return pb.EvalReply(loss=engine.evaluate(request.step, request.batch))
        except Exception as e:
            abort_on_error(context, e)
            raise


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    register_servicer(rpc.add_WorkerServicer_to_server, WorkerServicer(host), server)

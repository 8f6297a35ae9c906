"""SwarmX over gRPC: the servicer, and the two upstreams (MemoryX shards for the root, a parent node)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from weightstream.numerics import ModelDef
from weightstream.params import load_params, model_def
from weightstream.plan import JobSpec, Plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import RoleHost
from weightstream.swarmx.node import SwarmNodeLogic, Tensors
from weightstream.transport.rpc import (
    abort_on_error,
    add_service,
    call,
    open_channel,
    receive_tensors,
    stream,
    tensors_in,
    tensors_in_client,
    tensors_out,
    tensors_out_client,
)
from weightstream.transport.tensors import tensor_messages

__all__ = ["MemoryXUpstream", "ParentUpstream", "SwarmXServicer", "add_servicer", "build"]


class MemoryXUpstream:
    """The root's upstream: each tensor from (and each gradient to) the shard that owns it."""

    def __init__(
        self,
        model: ModelDef,
        plan: Plan,
        addresses: list[str],
        timeout_s: float,
        bf16: bool,
        token: str,
        generation: int,
    ) -> None:
        self.model, self.plan, self.timeout_s, self.bf16 = model, plan, timeout_s, bf16
        self.addresses = addresses
        channels = [open_channel(a, token, generation) for a in addresses]
        self.get_tensors = [
            tensors_out_client(c, "MemoryX", "GetTensors", pb.TensorRequest) for c in channels
        ]
        self.push = [tensors_in_client(c, "MemoryX", "PushGradients", pb.Ack) for c in channels]
        self._pool = ThreadPoolExecutor(max(1, len(addresses)), thread_name_prefix="memoryx-io")

    def _by_shard(self, names: list[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for n in names:
            out.setdefault(self.plan.tensor_shard[n], []).append(n)
        return out

    def fetch_unit(self, step: int, unit: int, pass_: int) -> list[bytes]:
        """The unit's raw messages: one segment per shard holding some of its tensors, in shard order."""
        names = list(self.model.units[unit].param_names)

        def fetch(shard: int, shard_names: list[str]) -> list[bytes]:
            peer = f"memoryx-{shard} ({self.addresses[shard]})"
            it = call(
                peer,
                "GetTensors",
                self.get_tensors[shard],
                pb.TensorRequest(step=step, names=shard_names),
                timeout=self.timeout_s,
            )
            return list(stream(peer, "GetTensors", it))

        parts = self._pool.map(lambda kv: fetch(*kv), sorted(self._by_shard(names).items()))
        return [msg for part in parts for msg in part]

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        def push(shard: int, shard_names: list[str]) -> None:
            msgs = tensor_messages(
                [(n, grads[n]) for n in shard_names], pb.StreamHead(step=step, unit=unit), self.bf16
            )
            call(
                f"memoryx-{shard} ({self.addresses[shard]})",
                "PushGradients",
                self.push[shard],
                msgs,
                timeout=self.timeout_s,
            )

        list(self._pool.map(lambda kv: push(*kv), self._by_shard(list(grads)).items()))


class ParentUpstream:
    """An inner node's upstream: its parent SwarmX node, where this node is child ``slot``."""

    def __init__(
        self, address: str, slot: int, timeout_s: float, bf16: bool, name: str, token: str, generation: int
    ) -> None:
        channel = open_channel(address, token, generation)
        self.get_unit = tensors_out_client(channel, "SwarmX", "GetUnit", pb.UnitRequest)
        self.push = tensors_in_client(channel, "SwarmX", "PushGradients", pb.Ack)
        self.slot, self.timeout_s, self.bf16, self.peer = slot, timeout_s, bf16, f"{name} ({address})"

    def fetch_unit(self, step: int, unit: int, pass_: int) -> list[bytes]:
        it = call(
            self.peer,
            "GetUnit",
            self.get_unit,
            pb.UnitRequest(step=step, unit=unit, phase=pass_),
            timeout=self.timeout_s,
        )
        return list(stream(self.peer, "GetUnit", it))

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        msgs = tensor_messages(
            grads.items(), pb.StreamHead(step=step, unit=unit, sender=self.slot), self.bf16
        )
        call(self.peer, "PushGradients", self.push, msgs, timeout=self.timeout_s)


def build(job: JobSpec) -> SwarmNodeLogic:
    params = load_params(job.params)
    plan = Plan.from_dict(job.plan)
    node = plan.swarm[job.index]
    timeout, bf16 = params.runconfig.rpc_timeout_s, params.model.fp16_type == "bfloat16"
    if node.parent is None:
        upstream: MemoryXUpstream | ParentUpstream = MemoryXUpstream(
            model_def(params), plan, job.addresses["memoryx"], timeout, bf16, job.credential, job.generation
        )
    else:
        upstream = ParentUpstream(
            job.addresses["swarmx"][node.parent],
            plan.child_slot("swarmx", job.index),
            timeout,
            bf16,
            f"swarmx-{node.parent}",
            job.credential,
            job.generation,
        )
    return SwarmNodeLogic(len(node.children), upstream, timeout)


class SwarmXServicer:
    """Only translates messages; ``SwarmNodeLogic`` does the work."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def GetUnit(self, request: pb.UnitRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        node: SwarmNodeLogic = self.host.logic(context)
        try:
            messages = node.get_unit(request.step, request.unit, request.phase)
        except Exception as e:
            abort_on_error(context, e)
        yield from messages  # relayed as received

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        node: SwarmNodeLogic = self.host.logic(context)
        return receive_tensors(
            context, request_iterator, lambda h, g: node.push_grads(h.step, h.unit, h.sender, g)
        )


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    s = SwarmXServicer(host)
    add_service(
        server,
        "SwarmX",
        {
            "GetUnit": tensors_out(s.GetUnit, pb.UnitRequest),
            "PushGradients": tensors_in(s.PushGradients, pb.Ack),
        },
    )

"""SwarmX over gRPC: the servicer, and the two upstreams (MemoryX shards for the root, a parent node)."""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from weightstream.numerics import ModelDef
from weightstream.params import load_params, model_def
from weightstream.plan import REPLICA, JobSpec, Plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import RoleHost, shm_tag
from weightstream.swarmx.node import SwarmNodeLogic, Tensors
from weightstream.transport.bulk import host_of_address
from weightstream.transport.peers import plane_for_peer
from weightstream.transport.plane import (
    SHARED_MEMORY,
    DataPlane,
    SharedMemoryPlane,
    inline,
    plane_of_call,
    relay,
)
from weightstream.transport.rpc import (
    TensorPush,
    abort_on_error,
    call,
    open_channel,
    push_header,
    push_tensors,
    receive_tensors,
    stream,
    tensors_in_client,
    tensors_out_client,
)
from weightstream.transport.servicers import register_servicer
from weightstream.transport.shm import KEPT_GRADIENT_BYTES
from weightstream.transport.tensors import references_only

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
        planes: list[DataPlane],
        readers: int = 1,
        replicas: Sequence[tuple[str, DataPlane]] = (),
    ) -> None:
        """``planes``: the data plane to each shard (transport/peers.py); ``readers``: this node's
        children, who each read every unit it fetches; ``replicas``: each shard's replica, if the job keeps
        them (``runconfig.memoryx_replicas``), as (address, plane): it is sent every gradient its shard is,
        at the same time."""
        self.model, self.plan, self.timeout_s, self.bf16 = model, plan, timeout_s, bf16
        self.readers = readers
        self.addresses, self.planes = addresses, planes
        channels = [
            open_channel(a, token, generation, p.kind) for a, p in zip(addresses, planes, strict=True)
        ]
        self.get_tensors = [
            tensors_out_client(c, "MemoryX", "GetTensors", pb.TensorRequest) for c in channels
        ]
        # where each shard's gradients go: the shard, then its replica if any (peer name, client, plane)
        self.sinks: list[list[tuple[str, TensorPush, DataPlane]]] = [
            [(f"memoryx-{i} ({a})", tensors_in_client(c, "MemoryX", "PushGradients", pb.Ack), p)]
            for i, (a, c, p) in enumerate(zip(addresses, channels, planes, strict=True))
        ]
        for i, (a, p) in enumerate(replicas):
            c = open_channel(a, token, generation, p.kind)
            self.sinks[i].append(
                (f"{REPLICA}-{i} ({a})", tensors_in_client(c, "MemoryX", "PushGradients", pb.Ack), p)
            )
        # a unit's shards stream in parallel; a few units may be in flight at once (prefetch, two passes)
        self._pool = ThreadPoolExecutor(
            max(2, 4 * len(addresses) * (1 + bool(replicas))), thread_name_prefix="memoryx-io"
        )

    def _by_shard(self, names: list[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for n in names:
            out.setdefault(self.plan.tensor_shard[n], []).append(n)
        return out

    def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterator[bytes]:
        """The unit's raw messages as they arrive: one segment per shard holding some of its tensors, in
        shard order. Every shard streams at once; a later shard's messages wait here for the earlier's."""
        names = list(self.model.units[unit].param_names)
        groups = sorted(self._by_shard(names).items())
        if len(groups) == 1:
            yield from self._fetch(step, *groups[0])
            return
        queues: list[queue.SimpleQueue[bytes | BaseException | None]] = [queue.SimpleQueue() for _ in groups]
        for q, (shard, shard_names) in zip(queues, groups, strict=True):
            self._pool.submit(_drain, q, functools.partial(self._fetch, step, shard, shard_names))
        for (shard, _), q in zip(groups, queues, strict=True):
            while (item := _next(q, self.timeout_s, f"memoryx-{shard}")) is not None:
                yield item

    def _fetch(self, step: int, shard: int, shard_names: list[str]) -> Iterator[bytes]:
        peer = f"memoryx-{shard} ({self.addresses[shard]})"
        request = pb.TensorRequest(step=step, names=shard_names)
        it = call(peer, "GetTensors", self.get_tensors[shard], request, timeout=self.timeout_s)
        # bulk transfers come on as this node's own, served to the children while they arrive
        return relay(stream(peer, "GetTensors", it), host_of_address(self.addresses[shard]), self.readers)

    def _to_sinks(self, names: list[str], send: Callable[[int, int, list[str]], None]) -> None:
        """``send(shard, sink, shard_names)`` for every shard holding some of ``names`` and each of its
        sinks (the shard, its replica), all at once."""
        jobs = [
            (shard, k, shard_names)
            for shard, shard_names in self._by_shard(names).items()
            for k in range(len(self.sinks[shard]))
        ]
        list(self._pool.map(lambda job: send(*job), jobs))

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        def push(shard: int, sink: int, shard_names: list[str]) -> None:
            peer, client, plane = self.sinks[shard][sink]
            push_tensors(
                peer,
                client,
                [(n, grads[n]) for n in shard_names],
                pb.StreamHead(step=step, unit=unit),
                plane=plane,
                bf16=self.bf16,
                timeout=self.timeout_s,
                key=(unit, shard, sink),  # the shards' pushes of one unit run at once
            )

        self._to_sinks(list(grads), push)

    @property
    def shares_memory(self) -> bool:
        """Whether every shard (and replica) is on this node's shared-memory plane: gradients in shared
        memory may then go up as a header alone (``relay_grads``)."""
        return all(p.kind == SHARED_MEMORY for sinks in self.sinks for _, _, p in sinks)

    @property
    def reader(self) -> DataPlane:
        """A plane that reads what the shards send: shared memory where any shard sends by reference."""
        return next((p for p in self.planes if p.kind == SHARED_MEMORY), self.planes[0])

    def relay_grads(self, step: int, unit: int, header: pb.TensorSetHeader) -> None:
        """Gradients in shared memory to the shards that own them: each shard gets a header naming its
        tensors where they lie (the bytes are not touched)."""

        def relay(shard: int, sink: int, shard_names: list[str]) -> None:
            mine = set(shard_names)
            part = pb.TensorSetHeader(
                head=pb.StreamHead(step=step, unit=unit),
                tensors=[t for t in header.tensors if t.name in mine],
            )
            peer, client, _ = self.sinks[shard][sink]
            push_header(peer, client, part, timeout=self.timeout_s)

        names = [t.name for t in header.tensors]
        if len(set(names)) != len(names):
            raise ValueError(f"unit {unit}: a tensor named twice in one push")
        unknown = [n for n in names if n not in self.plan.tensor_shard]
        if unknown:
            raise KeyError(f"gradients for tensors this job does not have: {unknown}")
        self._to_sinks(names, relay)


def _drain(q: queue.SimpleQueue[bytes | BaseException | None], fetch: Callable[[], Iterator[bytes]]) -> None:
    """One shard's stream into ``q``, then None (or the error)."""
    try:
        for msg in fetch():
            q.put(msg)
        q.put(None)
    except BaseException as e:
        q.put(e)


def _next(q: queue.SimpleQueue[bytes | BaseException | None], timeout_s: float, peer: str) -> bytes | None:
    try:
        item = q.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"{peer}: nothing received for {timeout_s}s") from None
    if isinstance(item, BaseException):
        raise item
    return item


class ParentUpstream:
    """An inner node's upstream: its parent SwarmX node, where this node is child ``slot``."""

    def __init__(
        self,
        address: str,
        slot: int,
        timeout_s: float,
        bf16: bool,
        name: str,
        token: str,
        generation: int,
        plane: DataPlane,
        readers: int = 1,
    ) -> None:
        """``readers``: this node's children, who each read every unit it fetches."""
        self.plane = self.reader = plane
        self.address, self.readers = address, readers
        self.shares_memory = plane.kind == SHARED_MEMORY
        channel = open_channel(address, token, generation, plane.kind)
        self.get_unit = tensors_out_client(channel, "SwarmX", "GetUnit", pb.UnitRequest)
        self.push = tensors_in_client(channel, "SwarmX", "PushGradients", pb.Ack)
        self.slot, self.timeout_s, self.bf16, self.peer = slot, timeout_s, bf16, f"{name} ({address})"

    def fetch_unit(self, step: int, unit: int, pass_: int) -> Iterator[bytes]:
        request = pb.UnitRequest(step=step, unit=unit, phase=pass_)
        it = call(self.peer, "GetUnit", self.get_unit, request, timeout=self.timeout_s)
        return relay(stream(self.peer, "GetUnit", it), host_of_address(self.address), self.readers)

    def push_grads(self, step: int, unit: int, grads: Tensors) -> None:
        head = pb.StreamHead(step=step, unit=unit, sender=self.slot)
        push_tensors(
            self.peer,
            self.push,
            grads.items(),
            head,
            plane=self.plane,
            bf16=self.bf16,
            timeout=self.timeout_s,
        )

    def relay_grads(self, step: int, unit: int, header: pb.TensorSetHeader) -> None:
        part = pb.TensorSetHeader(head=pb.StreamHead(step=step, unit=unit, sender=self.slot))
        part.tensors.extend(header.tensors)
        push_header(self.peer, self.push, part, timeout=self.timeout_s)


def build(job: JobSpec) -> SwarmNodeLogic:
    params = load_params(job.params)
    plan = Plan.from_dict(job.plan)
    node = plan.swarm[job.index]
    timeout, bf16 = params.runconfig.rpc_timeout_s, params.model.fp16_type == "bfloat16"
    tag = shm_tag(job)
    shared: list[SharedMemoryPlane] = []  # made once, for the first peer that shares this node's memory

    def plane(kept_bytes: int) -> SharedMemoryPlane:
        if not shared:
            assert tag is not None, "a shared-memory plane is chosen only where the job has a memfd tag"
            shared.append(SharedMemoryPlane(tag, kept_bytes=kept_bytes))
        return shared[0]

    if node.parent is None:
        # kept memfds for the sums this root sends MemoryX (``KEPT_GRADIENT_BYTES``; a single child's
        # gradients go up by reference and need none)
        kept = KEPT_GRADIENT_BYTES[params.runconfig.memoryx_storage]
        addresses = job.addresses["memoryx"]
        replicas = job.addresses.get(REPLICA, [])
        upstream: MemoryXUpstream | ParentUpstream = MemoryXUpstream(
            model_def(params),
            plan,
            addresses,
            timeout,
            bf16,
            job.credential,
            job.generation,
            [
                plane_for_peer(f"memoryx-{i}", a, job.credential, tag, lambda: plane(kept))
                for i, a in enumerate(addresses)
            ],
            len(node.children),
            [
                (a, plane_for_peer(f"{REPLICA}-{i}", a, job.credential, tag, lambda: plane(kept)))
                for i, a in enumerate(replicas)
            ],
        )
    else:  # its parent sums what it receives into memory of its own: kept memfds would be extra memory
        address, name = job.addresses["swarmx"][node.parent], f"swarmx-{node.parent}"
        upstream = ParentUpstream(
            address,
            plan.child_slot("swarmx", job.index),
            timeout,
            bf16,
            name,
            job.credential,
            job.generation,
            plane_for_peer(name, address, job.credential, tag, lambda: plane(0)),
            len(node.children),
        )
    # children that share this node's memory push to it in memfds: read with a plane of its own if no
    # upstream shares it too
    children = shared[0] if shared else SharedMemoryPlane(tag) if tag is not None else None
    return SwarmNodeLogic(len(node.children), upstream, timeout, children, bf16)


class SwarmXServicer(rpc.SwarmXServicer):
    """Only translates messages; ``SwarmNodeLogic`` does the work. Tensor streams are raw bytes
    (``register_servicer``)."""

    def __init__(self, host: RoleHost) -> None:
        self.host = host

    def GetUnit(self, request: pb.UnitRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        node: SwarmNodeLogic = self.host.logic(context)
        child = plane_of_call(context.invocation_metadata(), node.children)
        upstream = node.upstream
        try:
            # relayed as received, each message as soon as it is here; to a child on the network while
            # the upstream shares this node's memory, the bytes are read out of it and sent inline
            messages = node.get_unit(request.step, request.unit, request.phase)
            if child.kind != SHARED_MEMORY and upstream.reader.kind == SHARED_MEMORY:
                messages = inline(messages, upstream.reader, node.bf16)
            yield from messages
        except Exception as e:
            abort_on_error(context, e)

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        node: SwarmNodeLogic = self.host.logic(context)
        child = plane_of_call(context.invocation_metadata(), node.children)
        if child.kind == SHARED_MEMORY and node.upstream.shares_memory and node.num_children == 1:
            # nothing to sum and shared memory on both sides: pass the header on untouched
            try:
                messages = list(request_iterator)  # on this plane: one message, the header
                relayed = references_only(messages)
                if relayed is not None:
                    head, header = relayed
                    node.relay_grads(head.step, head.unit, head.sender, header)
                    return pb.Ack()
            except Exception as e:
                abort_on_error(context, e)
            request_iterator = iter(messages)
        return receive_tensors(
            context, request_iterator, lambda h, g: node.push_grads(h.step, h.unit, h.sender, g), child
        )

    def PushGradientsOne(self, request: bytes, context: grpc.ServicerContext) -> pb.Ack:
        """A push that is one message (``transport.rpc.TensorPush``), read as a stream of one."""
        return self.PushGradients(iter((request,)), context)


def add_servicer(host: RoleHost, server: grpc.Server) -> None:
    register_servicer(rpc.add_SwarmXServicer_to_server, SwarmXServicer(host), server)

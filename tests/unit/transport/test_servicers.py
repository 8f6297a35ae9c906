"""Every role's servicer is registered through the generated ``add_<Service>Servicer_to_server``
(transport/servicers.py): each method of its service in the proto, answered by the role's own servicer,
the tensor streams (``TensorChunk`` in the proto) with no (de)serialiser, so their bytes pass as they are,
and every other message with the generated protobuf one. A servicer missing a method is refused when it
is registered. (tests/unit/test_channel_threads.py calls such a service over gRPC.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import grpc
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.role import RoleHost
from weightstream.role_kinds import KINDS, role_kind
from weightstream.transport.servicers import raw_sides, register_servicer

SERVICE_OF = {"memoryx": "MemoryX", "swarmx": "SwarmX", "worker": "Worker", "activation": "Activation"}


class Details(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


class RecordingServer:
    """A ``grpc.Server`` that keeps the handlers registered on it."""

    def __init__(self) -> None:
        self.generic: list[Any] = []
        self.registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered[service] = handlers

    def found(self, path: str) -> grpc.RpcMethodHandler | None:
        """The handler the generic handlers give for ``path`` (as the server looks it up)."""
        return next((h for g in self.generic if (h := g.service(Details(path))) is not None), None)


def _behavior(h: grpc.RpcMethodHandler) -> Any:
    return h.unary_unary or h.unary_stream or h.stream_unary or h.stream_stream


def _message(name: str) -> Any:
    return getattr(pb, name.rsplit(".", 1)[1])


def test_the_proto_declares_the_tensor_streams_it_moves_as_raw_bytes() -> None:
    raw = {
        f"{s.name}.{m.name}": raw_sides(m)
        for s in pb.DESCRIPTOR.services_by_name.values()
        for m in s.methods
        if any(raw_sides(m))
    }
    assert raw == {
        "MemoryX.GetTensors": (False, True),
        "MemoryX.PushGradients": (True, False),
        "MemoryX.PushGradientsOne": (True, False),
        "SwarmX.GetUnit": (False, True),
        "SwarmX.PushGradients": (True, False),
        "SwarmX.PushGradientsOne": (True, False),
        "Activation.GetBatch": (False, True),
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_role_registers_its_service_through_the_generated_code(kind: str) -> None:
    server = RecordingServer()
    role_kind(kind).add_servicer(RoleHost(kind, lambda job: None, "t" * 64), server)  # type: ignore[arg-type]
    service = pb.DESCRIPTOR.services_by_name[SERVICE_OF[kind]]
    assert list(server.registered) == [service.full_name]
    handlers = server.registered[service.full_name]
    assert set(handlers) == {m.name for m in service.methods}
    for method in service.methods:
        h = handlers[method.name]
        # the generic handler answers the same path with the same handler (as the generated code registers)
        assert server.found(f"/{service.full_name}/{method.name}") is h
        assert (h.request_streaming, h.response_streaming) == (
            method.client_streaming,
            method.server_streaming,
        )
        request_raw, response_raw = raw_sides(method)
        want_in = None if request_raw else _message(method.input_type.full_name).FromString
        want_out = None if response_raw else _message(method.output_type.full_name).SerializeToString
        assert (h.request_deserializer, h.response_serializer) == (want_in, want_out), method.name
        # answered by the role's own servicer, not the generated base (UNIMPLEMENTED)
        assert _behavior(h).__func__.__module__ == f"weightstream.{kind}.service", method.name


class HalfSwarmX(rpc.SwarmXServicer):
    """Serves GetUnit and PushGradients, and leaves PushGradientsOne to the generated base class."""

    def GetUnit(self, request: pb.UnitRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield b""

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        return pb.Ack()


def test_a_servicer_missing_a_method_of_its_service_is_refused_naming_it() -> None:
    server = RecordingServer()
    with pytest.raises(
        TypeError, match=r"^HalfSwarmX does not implement weightstream.v1.SwarmX: PushGradientsOne$"
    ):
        register_servicer(rpc.add_SwarmXServicer_to_server, HalfSwarmX(), server)  # type: ignore[arg-type]
    assert server.generic == [] and server.registered == {}  # nothing half registered

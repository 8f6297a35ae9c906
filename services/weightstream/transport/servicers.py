"""A role's servicer registered through the generated ``add_<Service>Servicer_to_server``, its tensor
streams as raw bytes.

The proto declares every method of a role, tensor streams included: a method that moves tensors takes or
gives ``TensorChunk``, which stands for the raw layout of transport/tensors.py. The generated registration
would parse and build those as protobuf messages, copying each payload; ``register_servicer`` runs the
generated function against a stand-in server that keeps what it registers, clears the (de)serialiser of
every ``TensorChunk`` side (gRPC then hands the bytes over as they are, the wire format unchanged: no
copy, not even a Python call per message), and registers the result on the real server the way the
generated code does (a generic handler and the registered methods). The other methods keep the generated
protobuf (de)serialisers. A servicer that leaves a method of its service to the generated base class (an
UNIMPLEMENTED answer) is refused when it is registered, naming the method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc

__all__ = ["RAW_MESSAGE", "raw_sides", "register_servicer"]

RAW_MESSAGE = pb.TensorChunk.DESCRIPTOR.full_name  # a method's side of this type travels as raw bytes

_SERVICES: dict[str, ServiceDescriptor] = {s.full_name: s for s in pb.DESCRIPTOR.services_by_name.values()}

_HANDLER_OF = {  # (request streaming, response streaming) -> gRPC's constructor of such a handler
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def raw_sides(method: MethodDescriptor) -> tuple[bool, bool]:
    """(request raw, response raw): which sides of ``method`` are tensor streams (``TensorChunk``)."""
    return method.input_type.full_name == RAW_MESSAGE, method.output_type.full_name == RAW_MESSAGE


class _Recorder:
    """A server as the generated ``add_*Servicer_to_server`` sees it: keeps each service's handlers. The
    generated code hands them over twice, as a generic handler and by method; the second is kept."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come again, by method, in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.services[service] = dict(handlers)


def _raw(
    handler: grpc.RpcMethodHandler[Any, Any], request_raw: bool, response_raw: bool
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with no (de)serialiser on its raw sides (None: gRPC passes the bytes through)."""
    if not (request_raw or response_raw):
        return handler  # protobuf both ways, as generated
    streaming = (handler.request_streaming, handler.response_streaming)
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    if behavior is None:
        raise TypeError(f"a gRPC handler with no behaviour: {handler!r}")
    return _HANDLER_OF[streaming](
        behavior,
        request_deserializer=None if request_raw else handler.request_deserializer,
        response_serializer=None if response_raw else handler.response_serializer,
    )


def _unimplemented(servicer: object, service: ServiceDescriptor) -> list[str]:
    """The methods of ``service`` that ``servicer`` lacks or leaves to the generated base class."""
    return [
        m.name
        for m in service.methods
        if getattr(getattr(type(servicer), m.name, None), "__module__", rpc.__name__) == rpc.__name__
    ]


def register_servicer(
    add_to_server: Callable[[Any, Any], None], servicer: object, server: grpc.Server
) -> None:
    """Register ``servicer`` on ``server`` through ``add_to_server`` (a generated
    ``add_<Service>Servicer_to_server``), every ``TensorChunk`` side of its methods as raw bytes.
    TypeError, naming them, where the servicer does not implement every method of its service."""
    recorded = _Recorder()
    add_to_server(servicer, recorded)
    if not recorded.services:
        raise TypeError(f"{add_to_server.__name__} registered no service")
    for name, handlers in recorded.services.items():
        service = _SERVICES[name]
        missing = _unimplemented(servicer, service)
        if missing:
            raise TypeError(f"{type(servicer).__name__} does not implement {name}: {', '.join(missing)}")
        methods = {m: _raw(h, *raw_sides(service.methods_by_name[m])) for m, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, methods),))
        server.add_registered_method_handlers(name, methods)

"""gRPC plumbing shared by every role: servers, channels, deadlines and error mapping."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
import grpc.experimental
import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.auth import TokenMetadata
from weightstream.transport.bulk import host_of_peer
from weightstream.transport.errors import ChecksumError, PeerError, ProtocolError, RoleClosedError
from weightstream.transport.fencing import GENERATION_METADATA, StaleGenerationError
from weightstream.transport.plane import NETWORK, PLANE_METADATA, DataPlane
from weightstream.transport.tensors import NamedTensor, header_message

__all__ = [
    "OPTIONS",
    "SERVER_THREADS",
    "TensorPush",
    "abort_on_error",
    "call",
    "create_server",
    "open_channel",
    "push_header",
    "push_tensors",
    "receive_tensors",
    "stream",
    "tensors_in_client",
    "tensors_out_client",
]

T = TypeVar("T")
_MB = 1 << 20
# Frames are at most 4 MiB of data plus a few bytes of framing; 64 MiB leaves room for other messages.
OPTIONS = [
    ("grpc.max_send_message_length", 64 * _MB),
    ("grpc.max_receive_message_length", 64 * _MB),
    ("grpc.so_reuseport", 0),
]


SERVER_THREADS = "rpc-handler"  # name prefix of the threads a server runs its handlers on


def create_server(
    address: str,
    register: Callable[[grpc.Server], None],
    workers: int = 32,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> tuple[grpc.Server, int]:
    """A started server on ``address`` (port 0 picks a free one); returns it with the bound port.

    Many threads: a SwarmX node holds one open call per child while it waits for its parent, and a
    worker's step call waits while the same process serves nothing else heavy. They are named
    ``SERVER_THREADS``_k (in thread dumps, and so tests can tell them from threads a call starts)."""
    pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=SERVER_THREADS)
    server = grpc.server(pool, options=OPTIONS, interceptors=list(interceptors))
    register(server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    server.start()
    return server, port


def open_channel(address: str, token: str, generation: int = 0, plane: str = NETWORK) -> grpc.Channel:
    """A channel to a role whose every call carries the job's ``token`` (see ``transport.auth``), the
    ``generation`` of the configuration that opened it (see ``transport.fencing``) and the data ``plane``
    chosen for the pair (``transport.plane``: the role called answers and reads on it)."""
    extra = ((GENERATION_METADATA, str(generation)), (PLANE_METADATA, plane))
    # A subchannel pool of its own: gRPC otherwise shares one connection per address among a process's
    # channels, with its reconnect backoff. A role replaced at the same address (a Kubernetes pod keeps
    # its DNS name) would then fail the calls of the channels opened for it, fast, with the dead one's
    # "connection refused", for up to the backoff (1 s, growing), and the job retry the step in vain.
    # Unary-stream calls (a unit, a batch) read on the calling thread: gRPC otherwise starts a thread to
    # poll a channel with calls in flight, and ends it when none is left, so a role asking for one unit at a
    # time started a thread per call: ~27 a step at GPT-2 d512/L4 (38 in all, with the pushes'), each a
    # wakeup taken from the workers' compute cores.
    single_threaded = grpc.experimental.ChannelOptions.SingleThreadedUnaryStream
    options = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1), (single_threaded, 1)]
    return grpc.intercept_channel(
        grpc.insecure_channel(address, options=options), TokenMetadata(token, extra)
    )


def call(peer: str, name: str, fn: Callable[..., T], *args: Any, timeout: float, **kw: Any) -> T:
    """Call ``fn`` with a deadline; failures become ``PeerError`` naming the peer and the call."""
    try:
        return fn(*args, timeout=timeout, **kw)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        detail = e.details() if hasattr(e, "details") else str(e)
        raise PeerError(peer, name, f"{code.name if code else 'ERROR'}: {detail}") from e


def stream(peer: str, name: str, it: Iterator[T]) -> Iterator[T]:
    """Iterate a server stream, turning a mid-stream failure into ``PeerError``."""
    try:
        yield from it
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        detail = e.details() if hasattr(e, "details") else str(e)
        raise PeerError(peer, name, f"{code.name if code else 'ERROR'}: {detail}") from e


def push_tensors(
    peer: str,
    fn: Callable[..., Any],
    tensors: Iterable[NamedTensor],
    head: pb.StreamHead,
    *,
    plane: DataPlane,
    bf16: bool,
    timeout: float,
    key: object = None,
) -> None:
    """Push ``tensors`` as one stream opening with ``head`` (gradients to SwarmX or MemoryX) on ``plane``,
    the pair's data plane; ``key``: the sender's name for the stream's scratch (``DataPlane.push``)."""

    def send(messages: Iterator[bytes]) -> Any:
        return call(peer, "PushGradients", fn, messages, timeout=timeout)

    plane.push(send, tensors, head, bf16=bf16, key=key)


def push_header(peer: str, fn: Callable[..., Any], header: pb.TensorSetHeader, *, timeout: float) -> None:
    """Push a stream that is ``header`` alone, its tensors lying in shared memory (a relay passing on
    gradients it never read: ``transport.tensors.references_only``)."""
    call(peer, "PushGradients", fn, iter([header_message(header)]), timeout=timeout)


def abort_on_error(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Map our exceptions to gRPC status codes (never returns)."""
    if isinstance(exc, StaleGenerationError):
        context.abort(grpc.StatusCode.ABORTED, str(exc))
    if isinstance(exc, ChecksumError):
        context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
    if isinstance(exc, PermissionError):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
    if isinstance(exc, ProtocolError | ValueError | KeyError):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "timed out")
    if isinstance(exc, PeerError | RoleClosedError):
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def receive_tensors(
    context: grpc.ServicerContext,
    messages: Iterator[bytes],
    handle: Callable[[pb.StreamHead, dict[str, np.ndarray]], None],
    plane: DataPlane,
) -> pb.Ack:
    """The body of every client-streaming tensor RPC (gradients pushed to SwarmX or MemoryX): read the
    whole stream, checking every checksum; it must open with a StreamHead saying whose tensors they are;
    hand both to ``handle``, and map any error to a status code. ``plane``: the data plane the call came
    on (``transport.plane.plane_of_call``)."""
    try:
        head, tensors = plane.read(messages, peer=host_of_peer(context.peer()))
        if head is None:
            raise ValueError("a tensor stream pushed to a role must open with a StreamHead")
        handle(head, tensors)
    except Exception as e:
        abort_on_error(context, e)
    return pb.Ack()


# ---------------------------------------------------------------------------------------------------------
# Tensor streams travel as raw bytes (see transport/tensors.py), so their methods are called with identity
# (de)serialisers instead of the generated protobuf ones (and served so: transport/servicers.py).
# ---------------------------------------------------------------------------------------------------------
_PACKAGE = "weightstream.v1"


def _identity(b: bytes) -> bytes:
    return b


def tensors_out_client(channel: grpc.Channel, service: str, method: str, request: Any) -> Any:
    return channel.unary_stream(
        f"/{_PACKAGE}.{service}/{method}",
        request_serializer=request.SerializeToString,
        response_deserializer=_identity,
    )


class TensorPush:
    """A client of a tensor-stream push (``tensors_in``): called as ``push(messages, timeout=...)``. A
    stream of one message (on the shared-memory plane, always: the header) goes as the unary call
    ``<method>One``: gRPC feeds a client stream from a thread it starts for each call, a wakeup taken
    from the workers' compute cores on a small machine, ~12 a step at GPT-2 d512/L4."""

    def __init__(self, channel: grpc.Channel, service: str, method: str, response: Any) -> None:
        path = f"/{_PACKAGE}.{service}/{method}"
        self._stream = channel.stream_unary(
            path, request_serializer=_identity, response_deserializer=response.FromString
        )
        self._one = channel.unary_unary(
            path + "One", request_serializer=_identity, response_deserializer=response.FromString
        )

    def __call__(self, messages: Iterable[bytes], timeout: float) -> Any:
        it = iter(messages)
        head = list(itertools.islice(it, 2))  # enough to tell one message from more (or none)
        if len(head) == 1:
            return self._one(head[0], timeout=timeout)
        return self._stream(itertools.chain(head, it), timeout=timeout)


def tensors_in_client(channel: grpc.Channel, service: str, method: str, response: Any) -> TensorPush:
    return TensorPush(channel, service, method, response)

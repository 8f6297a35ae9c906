"""Our calls start no thread (transport/rpc.py): channels read unary-stream calls (a unit, a batch) on
the calling thread (``open_channel``; gRPC's default starts a thread to poll a channel with calls in flight
and ends it when none is left, so a role asking for one unit at a time started a thread per call), and a
push of one message (a header naming shared memory) goes as a unary call (``TensorPush``; gRPC feeds a
client stream from a thread of its own), each thread a wakeup taken from the workers' compute cores."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.errors import PeerError
from weightstream.transport.rpc import (
    SERVER_THREADS,
    call,
    create_server,
    open_channel,
    stream,
    tensors_in_client,
    tensors_out_client,
)
from weightstream.transport.servicers import register_servicer


class FakeSwarmX(rpc.SwarmXServicer):
    """Answers GetUnit with three messages naming the unit; records each push (by method) it receives."""

    def __init__(self, pushed: list[tuple[str, list[bytes]]] | None) -> None:
        self.pushed = pushed

    def GetUnit(self, request: pb.UnitRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        if request.unit < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no such unit")
        for i in range(3):
            yield bytes([request.unit, i])

    def _push(self, messages: Iterator[bytes], context: grpc.ServicerContext, method: str) -> pb.Ack:
        received = list(messages)
        assert self.pushed is not None
        self.pushed.append((method, received))
        if received == [b"bad"]:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad push")
        return pb.Ack(message=str(len(received)))

    def PushGradients(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.Ack:
        return self._push(request_iterator, context, "PushGradients")

    def PushGradientsOne(self, request: bytes, context: grpc.ServicerContext) -> pb.Ack:
        return self._push(iter((request,)), context, "PushGradientsOne")


def _serve(pushed: list[tuple[str, list[bytes]]] | None = None) -> tuple[grpc.Server, int]:
    def register(server: grpc.Server) -> None:
        register_servicer(rpc.add_SwarmXServicer_to_server, FakeSwarmX(pushed), server)

    return create_server("127.0.0.1:0", register, workers=4)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads this process starts while the test runs."""
    names: list[str] = []
    original = threading.Thread.start

    def counted(self: threading.Thread, *args: Any, **kw: Any) -> None:
        names.append(self.name)
        original(self, *args, **kw)

    monkeypatch.setattr(threading.Thread, "start", counted)
    return names


def _callers(started: list[str]) -> list[str]:
    """The threads started on the calling side: the in-process server's pool may add a handler thread
    whenever a call arrives before the previous call's handler is back in the pool (a loaded machine)."""
    return [n for n in started if not n.startswith(SERVER_THREADS)]


def test_unary_stream_calls_start_no_thread(started: list[str]) -> None:
    server, port = _serve()
    try:
        get = tensors_out_client(
            open_channel(f"127.0.0.1:{port}", "t" * 64), "SwarmX", "GetUnit", pb.UnitRequest
        )

        def get_unit(unit: int) -> list[bytes]:
            it = call("swarmx-0", "GetUnit", get, pb.UnitRequest(step=0, unit=unit), timeout=10)
            return list(stream("swarmx-0", "GetUnit", it))

        for unit in range(3):  # the server's pool threads start now, and are reused from here on
            assert get_unit(unit) == [bytes([unit, i]) for i in range(3)]
        started.clear()
        for unit in range(20):
            assert get_unit(unit) == [bytes([unit, i]) for i in range(3)]
        assert _callers(started) == []
        # a failure mid-stream still reaches the caller as the peer's error
        with pytest.raises(PeerError, match="INVALID_ARGUMENT: no such unit"):
            get_unit(-1)
    finally:
        server.stop(grace=None)


def test_a_push_of_one_message_is_a_unary_call_and_longer_ones_a_stream(started: list[str]) -> None:
    pushed: list[tuple[str, list[bytes]]] = []
    server, port = _serve(pushed)
    try:
        push = tensors_in_client(
            open_channel(f"127.0.0.1:{port}", "t" * 64), "SwarmX", "PushGradients", pb.Ack
        )

        def send(messages: list[bytes]) -> str:
            return call("swarmx-0", "PushGradients", push, iter(messages), timeout=10).message

        assert send([b"header"]) == "1"  # the first call starts the server's pool thread
        started.clear()
        for i in range(10):
            assert send([b"header %d" % i]) == "1"
        assert _callers(started) == []
        assert send([b"a", b"b", b"c"]) == "3"  # a client stream: gRPC's thread feeds it
        assert send([]) == "0"  # an empty stream reaches the method as one (which refuses it in a role)
        one, many = "PushGradientsOne", "PushGradients"
        assert pushed[-3:] == [(one, [b"header 9"]), (many, [b"a", b"b", b"c"]), (many, [])]
        with pytest.raises(PeerError, match="INVALID_ARGUMENT: bad push"):
            send([b"bad"])  # the unary call's failure reaches the caller as the stream's would
    finally:
        server.stop(grace=None)

"""A role replaced at the same address (a Kubernetes pod keeps its DNS name) is reached at once by the
channels opened for it after the replacement, not after gRPC's reconnect backoff of the dead one."""

from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc

from weightstream.transport.rpc import OPTIONS, open_channel


def _serve(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(2), options=OPTIONS)
    echo: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
        lambda request, context: request
    )
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("Echo", {"Call": echo})])
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server


def _call(channel: grpc.Channel) -> bytes:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/Echo/Call")
    return call(b"ping", timeout=5)


def test_a_channel_opened_after_a_replacement_connects_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    old = _serve(port)
    before = open_channel(f"127.0.0.1:{port}", "token", generation=1)
    assert _call(before) == b"ping"
    assert old.stop(0).wait(5)  # gone: its port refuses connections
    for _ in range(3):  # calls to the dead role: refused, and this channel backs off before connecting again
        try:
            _call(before)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE
        time.sleep(0.3)
    new = _serve(port)  # the replacement, at the same address
    try:
        after = open_channel(f"127.0.0.1:{port}", "token", generation=2)  # as the reconfigured roles do
        assert _call(after) == b"ping"  # connected: not failed fast with the dead one's "connection refused"
        after.close()
    finally:
        before.close()
        new.stop(0)

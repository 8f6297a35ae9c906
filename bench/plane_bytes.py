"""What a byte costs the network data plane, against gRPC alone and a plain TCP socket, on loopback.

Roles on separate hosts exchange tensors on the network plane (``transport/plane.py``'s ``NetworkPlane``):
a header over gRPC naming a bulk transfer that the reader fetches over TCP (transport/bulk.py), or, for a
role without a bulk endpoint, every byte inline in the gRPC stream. On a machine whose cores the workers
share, what a byte costs comes out of their compute (``bench/hosts.py``'s ``cross_host_step_ratio``). This
bench prices one hop four ways, each a server process sending ``--chunks`` x 4 MiB of float32 tensors to
this process over 127.0.0.1:
- ``plane``: the network plane as roles run it: ``NetworkPlane.stream`` read back with
  ``NetworkPlane.read`` (a bulk transfer; checksums checked), both ends with a bulk endpoint, through
  ``create_server`` and the roles' channel options;
- ``inline``: the same with every byte inline over gRPC (``tensor_messages`` into ``read_messages``);
- ``grpc``: the same bytes as plain gRPC messages, nothing assembled or checked: gRPC's share;
- ``socket``: the same bytes over a TCP socket, ``sendall`` into ``recv_into`` a preallocated buffer.

Per byte, from each process's CPU clock (both ends together), and the hop's bytes per second; the median
of ``--rounds``. Ratios against ``plane`` are from the same run. Prints one JSON line.

    python bench/plane_bytes.py [--chunks 64 --rounds 5]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.transport import bulk
from weightstream.transport.auth import new_role_token
from weightstream.transport.plane import NetworkPlane
from weightstream.transport.rpc import OPTIONS, create_server
from weightstream.transport.tensors import CHUNK_BYTES, read_messages, tensor_messages

SERVICE = "/wsbench.Bytes/"


def _identity(b: bytes) -> bytes:
    return b


def _tensors(chunks: int) -> list[tuple[str, np.ndarray]]:
    """``chunks`` x CHUNK_BYTES of float32, as tensors of one chunk each (a GPT-2 block's matrices are
    of that order)."""
    rng = np.random.default_rng(0)
    n = CHUNK_BYTES // 4
    return [(f"t{i}", rng.standard_normal(n, dtype=np.float32)) for i in range(chunks)]


def _serve(chunks: int, token: str, ports: Any) -> None:
    """The sending end: a gRPC server (plane, inline, grpc), its bulk endpoint, and a TCP listener
    (socket), until killed."""
    tensors = _tensors(chunks)
    raw = [t.tobytes() for _, t in tensors]
    bulk.start("127.0.0.1", token)
    plane = NetworkPlane()

    def register(server: grpc.Server) -> None:
        handlers = {
            "Plane": grpc.unary_stream_rpc_method_handler(
                lambda _req, _ctx: plane.stream(tensors, bf16=False), _identity, _identity
            ),
            "Inline": grpc.unary_stream_rpc_method_handler(
                lambda _req, _ctx: tensor_messages(tensors), _identity, _identity
            ),
            "Grpc": grpc.unary_stream_rpc_method_handler(lambda _req, _ctx: iter(raw), _identity, _identity),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("wsbench.Bytes", handlers),))

    server, port = create_server("127.0.0.1:0", register)
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put((port, listener.getsockname()[1]))
    conn, _ = listener.accept()
    while conn.recv(1):  # one byte asks for a round
        for b in raw:
            conn.sendall(b)
    server.stop(None)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(server_pid: int, receive: Callable[[], int], rounds: int) -> dict[str, float]:
    """Median CPU-ns per byte (both ends) and GB/s of ``receive`` (which returns the bytes it took)."""
    receive()  # warm: connections, buffers, caches
    ns, rates = [], []
    for _ in range(rounds):
        c0, s0, t0 = _own_cpu_s(), _cpu_s(server_pid), time.monotonic()
        n = receive()
        t, c1, s1 = time.monotonic() - t0, _own_cpu_s(), _cpu_s(server_pid)
        ns.append((c1 - c0 + s1 - s0) / n * 1e9)
        rates.append(n / t / 1e9)
    return {
        "cpu_ns_per_byte": round(statistics.median(ns), 3),
        "gb_per_s": round(statistics.median(rates), 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=64, help="4 MiB chunks per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    token = new_role_token()
    bulk.start("127.0.0.1", token)  # this end fetches through it
    server = ctx.Process(target=_serve, args=(a.chunks, token, ports), daemon=True)
    server.start()
    try:
        grpc_port, sock_port = ports.get(timeout=60)
        total = a.chunks * CHUNK_BYTES
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=OPTIONS)
        plane_call = channel.unary_stream(SERVICE + "Plane", _identity, _identity)
        inline_call = channel.unary_stream(SERVICE + "Inline", _identity, _identity)
        grpc_call = channel.unary_stream(SERVICE + "Grpc", _identity, _identity)
        reader = NetworkPlane()

        def plane() -> int:
            _, out = reader.read(plane_call(b""), peer="127.0.0.1")
            return sum(t.nbytes for t in out.values())

        def inline() -> int:
            _, out = read_messages(inline_call(b""))
            return sum(t.nbytes for t in out.values())

        def plain_grpc() -> int:
            return sum(len(m) for m in grpc_call(b""))

        conn = socket.create_connection(("127.0.0.1", sock_port))
        buf = memoryview(bytearray(CHUNK_BYTES))

        def plain_socket() -> int:
            conn.sendall(b"x")
            n = 0
            while n < total:
                got = conn.recv_into(buf[n % CHUNK_BYTES :])
                if not got:
                    raise ConnectionError("the sender closed the socket mid-round")
                n += got
            return n

        result: dict[str, Any] = {
            "config": {"chunks": a.chunks, "chunk_bytes": CHUNK_BYTES, "rounds": a.rounds}
        }
        ways = (("plane", plane), ("inline", inline), ("grpc", plain_grpc), ("socket", plain_socket))
        assert server.pid is not None  # started above
        for name, receive in ways:
            result[name] = measure(server.pid, receive, a.rounds)
        base = result["plane"]["cpu_ns_per_byte"]
        result["inline_over_plane_cpu"] = round(result["inline"]["cpu_ns_per_byte"] / base, 3)
        result["grpc_over_plane_cpu"] = round(result["grpc"]["cpu_ns_per_byte"] / base, 3)
        result["socket_over_plane_cpu"] = round(result["socket"]["cpu_ns_per_byte"] / base, 3)
        conn.close()
        channel.close()
    finally:
        server.kill()
        server.join(timeout=10)
        bulk.stop()
    print(json.dumps(record("plane_bytes", result)), flush=True)
    return result


if __name__ == "__main__":
    main()

"""What a unit's control message costs on the role plane: one call per unit against one stream per pass.

On the shared-memory plane a unit crosses each hop as one small message (a header naming memfds), so
what a hop costs is gRPC's and Python's work around that message, not bytes. One stream per pass on each
hop instead of one call per unit is the lever left on that cost; this bench prices it before anyone builds
it. Both ends are the role plane as roles run it: ``create_server`` with the
role credential's interceptor in a process of its own, ``open_channel`` (the token and generation on
every call, unary-stream calls read on the calling thread), over TCP loopback and over a Unix socket.

Per unit, measured from each process's own CPU clock (``getrusage``) around ``--units`` units:
- ``call_per_unit``: a unary-stream call per unit answered by one message (today's GetUnit/GetTensors);
- ``stream_per_pass``: one bidirectional stream per pass of ``--pass-units`` units, the client asking
  for each unit on the open stream and reading its one message before asking for the next (so a worker
  would still hold at most what it asked for).

Prints one JSON line; ``ratio_stream_over_call`` (< 1: the stream is cheaper) is from the same run.

    python bench/rpc_costs.py [--units 3000 --pass-units 11 --message-bytes 300 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import grpc
from machine import record  # bench/machine.py: the machine, date, command and commit

from weightstream.transport.auth import RoleAuthInterceptor, new_role_token
from weightstream.transport.rpc import create_server, open_channel

_SERVICE = "bench.RpcCosts"
KINDS = ("call_per_unit", "stream_per_pass")


def _same(b: bytes) -> bytes:
    """Messages are raw bytes both ways: no (de)serialisation."""
    return b


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _serve(address: str, token: str, message_bytes: int, ready: Any) -> None:
    message = bytes(message_bytes)

    def unit(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield message

    def units(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in requests:
            yield message

    def cpu(request: bytes, context: grpc.ServicerContext) -> bytes:
        return repr(_cpu_s()).encode()

    handler = grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Unit": grpc.unary_stream_rpc_method_handler(unit, _same, _same),
            "Units": grpc.stream_stream_rpc_method_handler(units, _same, _same),
            "Cpu": grpc.unary_unary_rpc_method_handler(cpu, _same, _same),
        },
    )
    server, port = create_server(
        address,
        lambda s: s.add_generic_rpc_handlers((handler,)),
        interceptors=[RoleAuthInterceptor(token)],
    )
    ready.put(port)
    server.wait_for_termination()


def _requests(asks: queue.SimpleQueue[bytes | None]) -> Iterator[bytes]:
    while (ask := asks.get()) is not None:
        yield ask


def measure(
    channel: grpc.Channel, kind: str, units: int, pass_units: int, timeout: float
) -> tuple[float, float, int]:
    """(client CPU seconds, wall seconds, messages received) for ``units`` units the ``kind`` way (with
    ``stream_per_pass``, whole passes: ``units`` rounded down to a multiple of ``pass_units``)."""
    received = 0
    c0, t0 = _cpu_s(), time.perf_counter()
    if kind == "call_per_unit":
        call = channel.unary_stream(f"/{_SERVICE}/Unit", _same, _same)
        for _ in range(units):
            for _msg in call(b"u", timeout=timeout):
                received += 1
    elif kind == "stream_per_pass":
        stream = channel.stream_stream(f"/{_SERVICE}/Units", _same, _same)
        for _ in range(units // pass_units):
            asks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
            replies = stream(_requests(asks), timeout=timeout)
            for _ in range(pass_units):
                asks.put(b"u")  # the next unit is asked for only once the last one is here
                next(replies)
                received += 1
            asks.put(None)
            for _msg in replies:
                received += 1  # none: the server answers each ask once
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return _cpu_s() - c0, time.perf_counter() - t0, received


def run(a: argparse.Namespace) -> dict[str, Any]:
    token = new_role_token()
    n = a.units - a.units % a.pass_units  # whole passes, so both kinds move the same units
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rpc_costs_") as tmp:
        for transport, address in (("tcp_loopback", "127.0.0.1:0"), ("unix_socket", f"unix:{tmp}/s")):
            ready: Any = ctx.Queue()
            proc = ctx.Process(target=_serve, args=(address, token, a.message_bytes, ready), daemon=True)
            proc.start()
            try:
                port = ready.get(timeout=120)
                target = f"127.0.0.1:{port}" if transport == "tcp_loopback" else address
                channel = open_channel(target, token)
                server_cpu = channel.unary_unary(f"/{_SERVICE}/Cpu", _same, _same)
                rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
                for r in range(a.rounds):  # alternating, so that the machine's drift hits both alike
                    for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                        s0 = float(server_cpu(b"", timeout=a.timeout))
                        client_s, wall_s, got = measure(channel, kind, n, a.pass_units, a.timeout)
                        s1 = float(server_cpu(b"", timeout=a.timeout))
                        if got != n:
                            raise RuntimeError(f"{kind}: {got} messages for {n} units")
                        rows[kind].append((client_s, s1 - s0, wall_s))
                        us = 1e6 * (client_s + s1 - s0) / n
                        print(f"{transport} {kind}: {us:.0f} us a unit, both ends", file=sys.stderr)
                channel.close()
            finally:
                proc.kill()
                proc.join(10)
            out[transport] = {
                kind: {
                    "client_cpu_us_per_unit": round(1e6 * statistics.median(x[0] for x in ms) / n, 1),
                    "server_cpu_us_per_unit": round(1e6 * statistics.median(x[1] for x in ms) / n, 1),
                    "wall_us_per_unit": round(1e6 * statistics.median(x[2] for x in ms) / n, 1),
                }
                for kind, ms in rows.items()
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", type=int, default=3000, help="units per measurement")
    p.add_argument("--pass-units", type=int, default=11, help="units per stream (d512/L4: 6 + 5 a step)")
    p.add_argument("--message-bytes", type=int, default=300, help="a unit's header on the shm plane")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    if a.units < a.pass_units or a.pass_units < 1 or a.rounds < 1:
        p.error("need --units >= --pass-units >= 1 and --rounds >= 1")
    costs = run(a)

    def both(t: str, kind: str) -> float:
        c = costs[t][kind]
        return float(c["client_cpu_us_per_unit"] + c["server_cpu_us_per_unit"])

    tcp_call, tcp_stream = both("tcp_loopback", "call_per_unit"), both("tcp_loopback", "stream_per_pass")
    result = {
        "bench": "rpc_costs",
        "config": {k: getattr(a, k) for k in ("units", "pass_units", "message_bytes", "rounds")},
        "cpu_us_per_unit": costs,
        "tcp_both_ends_cpu_us_per_unit": {"call_per_unit": tcp_call, "stream_per_pass": tcp_stream},
        "ratio_stream_over_call": round(tcp_stream / tcp_call, 3),
        "ratio_unix_over_tcp_call": round(both("unix_socket", "call_per_unit") / tcp_call, 3),
    }
    print(json.dumps(record("rpc_costs", result)))


if __name__ == "__main__":
    main()

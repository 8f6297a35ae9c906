"""Bulk transfers: the network plane's tensor bytes over plain TCP, beside gRPC.

Why: over gRPC each byte is copied into a message at the sender, framed, and copied out of the message
at the receiver, by both ends' shared cores. On 2 cores that costs 1.39 CPU-ns a byte per hop against
0.33 for a TCP socket read straight into the receiver's buffer (bench/results/plane_bytes.jsonl). So
between hosts the stream's header still goes over gRPC, where the call's credential, deadline, generation
and status are, and names a transfer: the receiver fetches its payload from the sender's bulk port, on
the host it reached the sender at, straight into the aligned buffer the tensors will live in. The sender
hands the bytes from where they lie (the weights themselves, a gradient), copying nothing; the receiver
checks every tensor's checksum, end to end, as on every plane.

A transfer is *pulled*: the sender parks its payload in its ``Outbox`` under a random 128-bit id, the
receiver asks for that id. A pushed stream's payload is let go when the push returns (its receiver has
read it); an answered stream's (MemoryX's weights) when it has been fetched, or after ``TTL_S`` if its
reader is gone. A relay (SwarmX) parks a payload while it is still arriving (``Filling``) and serves its
children what has arrived: cut-through, as over gRPC. A full outbox refuses, and the sender sends inline
over gRPC: memory stays bounded, the step goes on.

Wire: the reader connects and sends ``MAGIC`` and the job's 64-hex-digit token (refused unless it is the
job's, compared in constant time; the connection is then closed). Then, any number of times: the reader
sends a 16-byte id; the sender answers an 8-byte little-endian length (``GONE`` where there is no such
transfer) and that many bytes. Connections are kept open from fetch to fetch (``BulkFetcher``).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import struct
import threading
from collections.abc import Callable, Sequence

from weightstream.transport.errors import PeerError, ProtocolError
from weightstream.transport.outbox import ID_BYTES, MAX_ENTRIES, TTL_S, Filling, Outbox

__all__ = [
    "GONE",
    "MAGIC",
    "TTL_S",
    "BulkEndpoint",
    "BulkFetcher",
    "BulkServer",
    "Filling",
    "Outbox",
    "endpoint",
    "host_of_address",
    "host_of_peer",
    "start",
    "stop",
]

log = logging.getLogger("weightstream.transport")

MAGIC = b"WSB1"
_LEN = struct.Struct("<Q")
GONE = (1 << 64) - 1  # the answer for an id the outbox does not hold (fetched, let go, expired, never)
MAX_CONNECTIONS = 256  # readers connected at once
MAX_IDLE = 64  # connections a fetcher keeps open between fetches
AUTH_TIMEOUT_S = 10.0  # a connection that does not say who it is by then is closed
_FILL_CHUNK = 1 << 20  # a relay makes what has arrived servable in pieces of this size: its cut-through
_IOV = 512  # pieces per sendmsg (Linux allows 1024)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        got = sock.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError(f"connection closed after {pos} of {len(view)} bytes")
        pos += got


def _ask(sock: socket.socket, key: bytes, timeout_s: float) -> int:
    """Ask for transfer ``key`` on a reader's connection: the length its sender answers (or ``GONE``)."""
    sock.settimeout(timeout_s)
    sock.sendall(key)
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    return int(n)


def _send_parts(sock: socket.socket, parts: Sequence[memoryview]) -> None:
    """Every byte of ``parts``, in order, gathered by the kernel (no copy here)."""
    pending = [p for p in parts if len(p)]
    while pending:
        batch = pending[:_IOV]
        sent = sock.sendmsg(batch)
        done = 0
        while done < len(batch) and sent >= len(batch[done]):
            sent -= len(batch[done])
            done += 1
        pending = pending[done:]
        if sent:
            pending[0] = pending[0][sent:]


class BulkServer:
    """Serves this role's outbox to the job's readers on ``host``:``port`` (0 picks a free port)."""

    def __init__(self, host: str, token: str, outbox: Outbox, port: int = 0) -> None:
        self.outbox, self._token = outbox, token.encode()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host.strip("[]"), port))
            self._sock.listen(64)
        except OSError:
            self._sock.close()  # a port in use: the role fails to start, and leaks no socket
            raise
        self.port: int = self._sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.served = [0, 0]  # transfers and bytes sent to readers so far
        threading.Thread(target=self._accept, name="bulk-accept", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _close(conn)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                if len(self._conns) >= MAX_CONNECTIONS or self._closed:
                    _close(conn)
                    continue
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="bulk-serve", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(AUTH_TIMEOUT_S)
            said = _recv_exact(conn, len(MAGIC) + len(self._token))
            if not (said[: len(MAGIC)] == MAGIC and hmac.compare_digest(said[len(MAGIC) :], self._token)):
                log.warning("bulk: refused a connection without this job's credential")
                return
            conn.settimeout(None)  # a reader keeps its connection between fetches, as long as it likes
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                key = _recv_exact(conn, ID_BYTES)
                entry = self.outbox.take(key)
                if entry is None:
                    conn.sendall(_LEN.pack(GONE))
                    continue
                conn.sendall(_LEN.pack(entry.total))
                if isinstance(entry, Filling):
                    _send_filling(conn, entry)
                else:
                    _send_parts(conn, entry.parts)
                with self._lock:
                    self.served[0] += 1
                    self.served[1] += entry.total
        except (OSError, ConnectionError):
            pass  # the reader went away, or this server is closing: the reader sees its fetch fail
        finally:
            with self._lock:
                self._conns.discard(conn)
            _close(conn)


def _send_filling(conn: socket.socket, entry: Filling) -> None:
    sent = 0
    while sent < entry.total:
        with entry.cond:
            while entry.filled == sent and entry.error is None:
                entry.cond.wait()
            filled, error = entry.filled, entry.error
        if filled == sent and error is not None:
            # the relay's own fetch failed: the reader must not take a torn payload for a whole one
            raise ConnectionError(error)
        conn.sendall(entry.buf.data[sent:filled])
        sent = filled


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class BulkFetcher:
    """Fetches transfers from other roles' bulk servers, keeping connections open between fetches."""

    def __init__(self, token: str) -> None:
        self._hello = MAGIC + token.encode()
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self.fetched = [0, 0]  # transfers and bytes received so far

    def _connect(self, host: str, port: int, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(self._hello)
        return sock

    def _transfer(
        self,
        host: str,
        port: int,
        key: bytes,
        out: memoryview,
        timeout_s: float,
        progress: Callable[[int], None] | None,
    ) -> None:
        where = (host, port)
        with self._lock:
            idle = self._idle.pop(where, [])  # back in at the end: the dict's order is the peers' recency
            sock = idle.pop() if idle else None
            if idle:
                self._idle[where] = idle
        reused = sock is not None
        try:
            if sock is None:
                sock = self._connect(host, port, timeout_s)
            try:
                n = _ask(sock, key, timeout_s)
            except OSError:
                if not reused:
                    raise
                _close(sock)  # a kept connection its server has since closed: once more on a new one
                sock = self._connect(host, port, timeout_s)
                n = _ask(sock, key, timeout_s)
            if n == GONE:
                raise ProtocolError(
                    f"bulk transfer {key.hex()} is not held at {host}:{port} (fetched already, let go, or "
                    f"older than {TTL_S:.0f} s)"
                )
            if n != len(out):
                raise ProtocolError(f"bulk transfer {key.hex()} is {n} bytes; its header said {len(out)}")
            for pos in range(0, len(out), _FILL_CHUNK):
                piece = out[pos : pos + _FILL_CHUNK]
                _recv_into(sock, piece)
                if progress is not None:
                    progress(len(piece))
        except (ProtocolError, OSError) as e:  # the connection is in an unknown state: never kept
            if sock is not None:
                _close(sock)
            if isinstance(e, ProtocolError):
                raise
            raise PeerError(f"bulk {host}:{port}", "fetch", f"{type(e).__name__}: {e}") from e
        with self._lock:
            self._idle.setdefault(where, []).append(sock)
            self.fetched[0] += 1
            self.fetched[1] += len(out)
            stale = self._trim()
        for old in stale:
            _close(old)

    def _trim(self) -> list[socket.socket]:
        """Sockets beyond ``MAX_IDLE`` kept ones, the peers used longest ago first: roles replaced after a
        fault leave kept connections to servers that are gone."""
        stale: list[socket.socket] = []
        while sum(len(v) for v in self._idle.values()) > MAX_IDLE:
            oldest = next(iter(self._idle))
            stale.extend(self._idle.pop(oldest))
        return stale

    def fill(self, host: str, port: int, key: bytes, into: Filling, timeout_s: float) -> None:
        """Transfer ``key`` into ``into`` piece by piece, each piece servable as soon as it is in (a
        relay's cut-through). On failure ``into`` fails too: its readers see their fetch fail."""
        try:
            self._transfer(host, port, key, into.buf.data, timeout_s, into.advance)
        except BaseException as e:
            into.fail(f"the relay's fetch from {host}:{port} failed: {e}")
            raise

    def fetch(self, host: str, port: int, key: bytes, out: memoryview, timeout_s: float) -> None:
        """Transfer ``key`` from ``host``:``port`` into ``out``, which is exactly its size."""
        self._transfer(host, port, key, out, timeout_s, None)

    def close(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle = {}
        for sock in socks:
            _close(sock)


class BulkEndpoint:
    """A role's bulk transfers: its outbox, the server that serves it, and its fetcher of others'."""

    def __init__(self, host: str, token: str, port: int = 0, max_entries: int = MAX_ENTRIES) -> None:
        self.outbox = Outbox(max_entries)
        self.server = BulkServer(host, token, self.outbox, port)
        self.fetcher = BulkFetcher(token)

    @property
    def port(self) -> int:
        return self.server.port

    def summary(self) -> str:
        """What went through this endpoint, for the role's log."""
        (sent, sent_bytes), (got, got_bytes) = self.server.served, self.fetcher.fetched
        return (
            f"bulk transfers: served {sent} ({sent_bytes} bytes), fetched {got} ({got_bytes} bytes), "
            f"{len(self.outbox)} left parked"
        )

    def close(self) -> None:
        self.server.close()
        self.fetcher.close()


def host_of_address(address: str) -> str:
    """The host of a gRPC target ``host:port`` (``[v6]:port`` too)."""
    host, sep, _ = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]")


def host_of_peer(peer: str) -> str | None:
    """The host of a gRPC ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``), None for other kinds."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    return host_of_address(rest)


# -- this process's endpoint -----------------------------------------------------------------------------
# One per role process, started with its gRPC server (role.serve_role) on the same interface: the planes
# (transport/plane.py) send and fetch through it. A process without one (a role served in a test's own
# process) sends every byte inline over gRPC, and refuses a stream that names a bulk transfer.
_endpoint: BulkEndpoint | None = None


def start(host: str, token: str, port: int = 0, max_entries: int = MAX_ENTRIES) -> BulkEndpoint:
    """Start this process's bulk endpoint (replacing any)."""
    global _endpoint
    stop()
    _endpoint = BulkEndpoint(host, token, port, max_entries)
    return _endpoint


def stop() -> None:
    global _endpoint
    if _endpoint is not None:
        _endpoint.close()
        _endpoint = None


def endpoint() -> BulkEndpoint | None:
    """This process's bulk endpoint, None where it has none."""
    return _endpoint

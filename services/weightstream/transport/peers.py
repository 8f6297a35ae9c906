"""Which data plane a pair of roles uses: shared memory on one host, the network between hosts.

Each role knows its host identity (``host_identity``) and, from its start, holds a probe: a memfd of its
job holding that identity (``MemfdProbe``), whose location its Health reply gives to callers with the
job's credential. A role that calls another (a worker its SwarmX node, a SwarmX node its parent or the
MemoryX shards) asks it for both once, when it is built, and picks shared memory only when the two
identities are the same AND it can map the peer's probe and read the identity back: the identity alone
could be wrong (a container that shows another's hostname, a /proc mounted without the peer's processes),
the probe is what the shared-memory plane will do. Anything else picks the network, with a log line saying
why. The choice holds for the pair, in both directions, until the next configuration.

Why these parts of the identity: a memfd is reached through ``/proc/<pid>/fd/<fd>``, so the peer must be
in the same PID namespace (its inode), on the same running kernel (the boot id) and the same machine (the
host name, for readers of the log); and the kernel lets a process open another's fds only as the same user
(its uid; root could open anyone's, but not the other way round): with all four the same, a probe that
maps one way maps the other, and the choice holds for both directions of the pair.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.errors import ProtocolError
from weightstream.transport.plane import NETWORK, SHARED_MEMORY, DataPlane, NetworkPlane
from weightstream.transport.rpc import call, open_channel
from weightstream.transport.shm import SharedArena, attach, locate

__all__ = ["MemfdProbe", "PlaneChoice", "ask_peer", "can_map", "choose", "host_identity", "plane_for_peer"]

log = logging.getLogger("weightstream.transport")

PROBE_TIMEOUT_S = 10.0  # the Health call that asks a peer for its identity: it answers at once when up


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def host_identity() -> str:
    """``<host name>/<boot id>/<PID namespace inode>/<user id>``: the same for two processes exactly when
    they are on one host as far as shared memory goes (see the module's docstring)."""
    try:
        pid_ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pid_ns = "?"
    return f"{socket.gethostname()}/{_read('/proc/sys/kernel/random/boot_id')}/{pid_ns}/{os.getuid()}"


class MemfdProbe:
    """A memfd of this role's job holding its host identity, for peers to map (``can_map``)."""

    def __init__(self, tag: str, identity: str | None = None) -> None:
        self.identity = identity if identity is not None else host_identity()
        data = self.identity.encode()
        self._arena = SharedArena(tag)
        self._buf = self._arena.empty((len(data),), np.uint8)
        self._buf[:] = np.frombuffer(data, dtype=np.uint8)
        loc = locate(self._buf)
        assert loc is not None, "an arena's arrays lie in memfds"
        self.pid, self.fd = loc.pid, loc.fd

    def close(self) -> None:
        self._arena.close()


def can_map(pid: int, fd: int, tag: str, identity: str) -> bool:
    """Whether this process can map process ``pid``'s probe memfd ``fd`` of this job and reads ``identity``
    there."""
    if pid <= 0:
        return False
    try:
        return attach(pid, fd, tag).tobytes() == identity.encode()
    except (ProtocolError, OSError):
        return False


@dataclass(frozen=True)
class PlaneChoice:
    """A pair's plane (``NETWORK`` or ``SHARED_MEMORY``) and why, for the log."""

    kind: str
    reason: str
    fallback: bool = False  # on one host, yet the network: worth a warning


def choose(mine: str, peer: str, probe: Callable[[], bool]) -> PlaneChoice:
    """The plane of a pair whose roles are on hosts ``mine`` and ``peer`` (``host_identity``); ``probe``
    maps the peer's probe memfd (called only when the identities are the same)."""
    if mine != peer:
        return PlaneChoice(NETWORK, f"on another host ({peer or 'unknown'}; this role: {mine})")
    if not probe():
        return PlaneChoice(NETWORK, f"on this host ({mine}) but its memfds cannot be mapped from here", True)
    return PlaneChoice(SHARED_MEMORY, f"on this host ({mine}), its memfds map")


def ask_peer(address: str, token: str) -> pb.HealthReply:
    """The peer's Health reply (host identity and probe location, given to callers with ``token``)."""
    channel = open_channel(address, token)
    try:
        reply: pb.HealthReply = call(
            address, "Health", rpc.ControlStub(channel).Health, pb.Empty(), timeout=PROBE_TIMEOUT_S
        )
        return reply
    finally:
        channel.close()


def plane_for_peer(
    name: str, address: str, token: str, tag: str | None, shared: Callable[[], DataPlane]
) -> DataPlane:
    """The plane for calls to peer ``name`` at ``address``: ``shared()`` (this role's shared-memory plane)
    where ``choose`` picks it, else the network. ``tag``: the job's memfd tag, None where the job keeps
    every byte on the network (``runconfig.data_plane: grpc``)."""
    if tag is None:
        return NetworkPlane()
    reply = ask_peer(address, token)
    choice = choose(
        host_identity(), reply.host, lambda: can_map(reply.probe_pid, reply.probe_fd, tag, reply.host)
    )
    (log.warning if choice.fallback else log.info)(
        "data plane to %s (%s): %s, %s", name, address, choice.kind.replace("_", " "), choice.reason
    )
    return shared() if choice.kind == SHARED_MEMORY else NetworkPlane()

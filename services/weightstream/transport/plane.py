"""The data plane: how tensor streams travel between two roles, one implementation per way.

Two ways, one interface. ``NetworkPlane``: every byte goes over the network: the header over gRPC and
the payload as a bulk transfer the reader fetches over TCP (transport/bulk.py), or inline in the gRPC
stream where a role has no bulk endpoint (transport/tensors.py).
``SharedMemoryPlane``: the bytes stay in memfds and only the header goes over gRPC (transport/shm.py);
it works only between roles that can map each other's memfds. Which one a pair of roles uses is chosen
once, when the role that calls the other is built (transport/peers.py), and the caller says so on every
call (``PLANE_METADATA``), so the role it calls answers and reads on the same plane. Both check every
tensor's checksum (XXH3-64) at the receiver, end to end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport import bulk
from weightstream.transport.errors import ProtocolError
from weightstream.transport.shm import REFERENCES_ONLY, KeptScratch, SharedArena
from weightstream.transport.shm_cache import MappingCache
from weightstream.transport.tensors import (
    Fetch,
    NamedTensor,
    Park,
    bulk_header,
    header_message,
    inline_segment,
    names_shared_memory,
    read_messages,
    tensor_messages,
)

__all__ = [
    "NETWORK",
    "PLANE_METADATA",
    "SHARED_MEMORY",
    "DataPlane",
    "NetworkPlane",
    "SharedMemoryPlane",
    "inline",
    "plane_of_call",
    "relay",
]

NETWORK, SHARED_MEMORY = "network", "shared_memory"
PLANE_METADATA = "x-weightstream-plane"  # the plane the caller chose for this pair: NETWORK or SHARED_MEMORY

Tensors = dict[str, np.ndarray]
Read = tuple[pb.StreamHead | None, Tensors]  # what reading a stream gives: its head (or None) and tensors
STALL_S = 60.0  # a bulk fetch that receives nothing for this long fails (the sender is gone)


def _fetch_from(peer: str | None) -> Fetch | None:
    """How to fetch bulk transfers from the role on host ``peer`` (None where unknown or this process has
    no bulk endpoint: a stream naming one is then refused)."""
    end = bulk.endpoint()
    if peer is None or end is None:
        return None

    def fetch(port: int, key: bytes, out: memoryview) -> None:
        end.fetcher.fetch(peer, port, key, out, STALL_S)

    return fetch


def _park(end: bulk.BulkEndpoint | None, readers: int, kept: list[bytes] | None = None) -> Park | None:
    """Parks payloads in ``end``'s outbox (this process's bulk endpoint) for ``readers`` fetches (their ids
    appended to ``kept``, for the sender to let go), None where there is no endpoint."""
    if end is None:
        return None

    def park(parts: list[memoryview]) -> tuple[int, bytes] | None:
        key = end.outbox.offer(parts, readers)
        if key is None:
            return None
        if kept is not None:
            kept.append(key)
        return end.port, key

    return park


class DataPlane(ABC):
    """Sending and receiving tensor streams between this role and one peer."""

    kind: str

    @abstractmethod
    def stream(
        self, tensors: Iterable[NamedTensor], *, bf16: bool, checksums: Mapping[str, int] | None = None
    ) -> Iterator[bytes]:
        """The messages of a stream answering a call (MemoryX's weights). ``checksums``: known checksums of
        float32 tensors sent as they are."""

    @abstractmethod
    def push(
        self,
        send: Callable[[Iterator[bytes]], Any],
        tensors: Iterable[NamedTensor],
        head: pb.StreamHead,
        *,
        bf16: bool,
        key: object = None,
    ) -> None:
        """Push ``tensors`` as one stream opening with ``head``: ``send(messages)`` makes the call and
        returns once the receiver has read them all. ``key``: the sender's name for this stream's scratch
        (default ``head.unit``), kept from call to call where the plane keeps any."""

    @abstractmethod
    def read(self, messages: Iterable[bytes], peer: str | None = None) -> Read:
        """(head or None, {name: array}) of a stream, every checksum checked. ``peer``: the host the stream
        came from, where its bulk transfers are fetched (transport/bulk.py)."""

    def close(self) -> None:  # noqa: B027 - a plane with nothing to let go of needs no override
        """Let go of whatever the plane holds (memfds, mappings)."""


class NetworkPlane(DataPlane):
    """Every byte over the network: works between any two roles that can reach each other. The payload is
    a bulk transfer where this process has a bulk endpoint (transport/bulk.py), else inline over gRPC.

    A stream that names shared memory is refused when read: a peer on this plane cannot map it."""

    kind = NETWORK

    def stream(
        self, tensors: Iterable[NamedTensor], *, bf16: bool, checksums: Mapping[str, int] | None = None
    ) -> Iterator[bytes]:
        # parked for its one reader; let go once fetched, or after bulk.TTL_S where the reader is gone
        return tensor_messages(tensors, bf16=bf16, checksums=checksums, park=_park(bulk.endpoint(), 1))

    def push(
        self,
        send: Callable[[Iterator[bytes]], Any],
        tensors: Iterable[NamedTensor],
        head: pb.StreamHead,
        *,
        bf16: bool,
        key: object = None,
    ) -> None:
        end, parked = bulk.endpoint(), list[bytes]()
        try:
            send(tensor_messages(tensors, head, bf16, park=_park(end, 1, parked)))
        finally:  # the call has returned: its receiver has fetched the payload, or never will
            if end is not None:
                for parked_key in parked:
                    end.outbox.release(parked_key)

    def read(self, messages: Iterable[bytes], peer: str | None = None) -> Read:
        return read_messages(messages, fetch=_fetch_from(peer))


_NETWORK = NetworkPlane()  # holds nothing: one serves every call that arrives on the network


class SharedMemoryPlane(DataPlane):
    """Bytes in memfds, the header over gRPC: between roles on one host (transport/shm.py).

    ``tag``: the job's memfd tag; the receiver opens only memfds that carry it. ``arena``: this role's
    memfds (made here when not given). ``kept_bytes``: gradient memfds to keep from push to push
    (``KeptScratch``); ``kept_mappings``: peers' memfds to keep mapped from read to read (``MappingCache``,
    or ``maps`` where the role keeps its own). A stream answering a call sends tensors by reference only:
    they must lie in memfds already (MemoryX's weights), nothing is copied silently."""

    kind = SHARED_MEMORY

    def __init__(
        self,
        tag: str,
        *,
        arena: SharedArena | None = None,
        kept_bytes: int = 0,
        kept_mappings: int = 0,
        maps: MappingCache | None = None,
    ) -> None:
        self.tag, self._arena = tag, arena
        self.kept = KeptScratch(self.arena, kept_bytes) if kept_bytes else None
        self.maps = maps if maps is not None else MappingCache(kept_mappings) if kept_mappings else None

    @property
    def arena(self) -> SharedArena:
        """This role's memfds for what it pushes: made on first use (a plane that only reads makes none)."""
        if self._arena is None:
            self._arena = SharedArena(self.tag)
        return self._arena

    def stream(
        self, tensors: Iterable[NamedTensor], *, bf16: bool, checksums: Mapping[str, int] | None = None
    ) -> Iterator[bytes]:
        return tensor_messages(tensors, bf16=bf16, checksums=checksums, shm=REFERENCES_ONLY)

    def push(
        self,
        send: Callable[[Iterator[bytes]], Any],
        tensors: Iterable[NamedTensor],
        head: pb.StreamHead,
        *,
        bf16: bool,
        key: object = None,
    ) -> None:
        # what is copied into memfds for the call is let go once it has returned, when the receiver has
        # mapped it; with ``kept`` the copy goes into the memfd kept for the key instead
        scratch = self.kept.lease(head.unit if key is None else key) if self.kept else self.arena.lease()
        with scratch as shm:
            send(tensor_messages(tensors, head, bf16, shm=shm))

    def read(self, messages: Iterable[bytes], peer: str | None = None) -> Read:
        return read_messages(messages, self.tag, self.maps, _fetch_from(peer))

    def close(self) -> None:
        if self.kept is not None:
            self.kept.close()
        if self.maps is not None:
            self.maps.close()


def plane_of_call(metadata: Iterable[tuple[str, Any]] | None, shared: DataPlane | None) -> DataPlane:
    """The plane a call arrived on: ``shared`` (this role's shared-memory plane, None if it has none) where
    the caller chose shared memory for the pair (``PLANE_METADATA``), else the network."""
    said = next((v for k, v in metadata or () if k == PLANE_METADATA), NETWORK)
    return shared if said == SHARED_MEMORY and shared is not None else _NETWORK


def inline(messages: Iterable[bytes], reader: DataPlane, bf16: bool) -> Iterator[bytes]:
    """A stream read through ``reader`` (which may name the sender's shared memory) with every byte inline,
    for a peer on the network plane: what a relay sends on to another host. A segment naming shared memory
    (one message) is read, its tensors checked, and sent again inline, checksummed anew; any other message
    goes on as it came, as soon as it came."""
    for message in messages:
        if names_shared_memory(message):
            head, tensors = reader.read((message,))
            yield from tensor_messages(tensors.items(), head, bf16, park=_park(bulk.endpoint(), 1))
        else:
            yield message


def relay(messages: Iterable[bytes], peer: str, readers: int) -> Iterator[bytes]:
    """A stream from the role on host ``peer`` passed on to ``readers`` readers, each message as soon as it
    came (a SwarmX node's weights, to its children). A segment whose payload is a bulk transfer goes on as a
    header naming a transfer of this role's, served to the readers while it arrives from ``peer``
    (cut-through); where this role's outbox is full, inline once it has all arrived; without a bulk
    endpoint here, refused. Checks nothing: the readers check every tensor, end to end."""
    end = bulk.endpoint()
    for message in messages:
        header = bulk_header(message)
        if header is None:
            yield message
            continue
        if end is None:
            raise ProtocolError("the stream names a bulk transfer, which this relay cannot fetch")
        parked = end.outbox.filling(header.total_bytes, readers)
        if parked is None:  # outbox full: this segment inline, once it has all arrived
            payload = np.empty(header.total_bytes, dtype=np.uint8)
            end.fetcher.fetch(peer, header.bulk_port, header.bulk_id, payload.data, STALL_S)
            yield from inline_segment(header, payload)
            continue
        key, filling = parked
        own = pb.TensorSetHeader()
        own.CopyFrom(header)
        own.bulk_port, own.bulk_id = end.port, key
        yield header_message(own)
        end.fetcher.fill(peer, header.bulk_port, header.bulk_id, filling, STALL_S)

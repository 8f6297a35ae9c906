"""Errors of the transport boundary: retryable (the peer may come back) versus permanent."""

from __future__ import annotations

__all__ = ["ChecksumError", "PeerError", "ProtocolError", "RoleClosedError", "TransportError"]


class TransportError(RuntimeError):
    """Something went wrong moving tensors between roles."""


class ChecksumError(TransportError):
    """A tensor arrived with bytes that do not match its checksum. Permanent for that transfer."""


class ProtocolError(TransportError):
    """Frames in an order or shape the protocol does not allow (a bug, not a network fault)."""


class PeerError(TransportError):
    """A call to another role failed or timed out; names the role, the call and the gRPC status."""

    def __init__(self, peer: str, call: str, detail: str) -> None:
        self.peer, self.call, self.detail = peer, call, detail
        super().__init__(f"{call} to {peer} failed: {detail}")


class RoleClosedError(RuntimeError):
    """The role's logic was closed during the call: its process is stopping, or a new configuration of the
    job replaced it. Not the request's fault: another attempt (at the replacement) may succeed, so callers
    see UNAVAILABLE, as gRPC itself answers for a server shutting down."""

"""What a MemoryX shard's calls raise beyond the builtins (``transport.rpc.abort_on_error`` maps them:
a stale step is an invalid argument, a closed shard is unavailable, so the caller may try again)."""

from __future__ import annotations

from weightstream.transport.errors import RoleClosedError

__all__ = ["ShardClosedError", "StaleStepError"]


class StaleStepError(ValueError):
    """A call names a step this shard has already moved past (or has not reached)."""


class ShardClosedError(RoleClosedError):
    """The shard was closed (its role is stopping, or a new configuration replaced it) during a call."""

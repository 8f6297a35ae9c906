"""The role plane's credential: one random token per job run, carried as call metadata on every role RPC.

The coordinator makes the token when it starts a job's roles and hands it to each role through a file
(a pipe for local processes, a Kubernetes Secret for pods): never a command line, which ``ps`` shows to
every user, nor an environment variable, which children inherit. Every role server checks it in an
interceptor before any handler runs, so an unauthenticated call does no work and reads no state; only
``Control/Health`` answers without it, and then says nothing but "serving" (see ``role.py``).
"""

from __future__ import annotations

import hmac
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "HEALTH_METHOD",
    "TOKEN_METADATA",
    "RoleAuthInterceptor",
    "TokenMetadata",
    "has_credential",
    "new_role_token",
    "read_token",
]

TOKEN_METADATA = "x-weightstream-role-token"  # lower case: gRPC metadata keys are
HEALTH_METHOD = "/weightstream.v1.Control/Health"
_TOKEN = re.compile(r"[0-9a-f]{64}")


def new_role_token() -> str:
    """A fresh 256-bit token, as 64 lower-case hex digits."""
    return secrets.token_hex(32)


def read_token(source: str) -> str:
    """The token from the file ``source`` (``-``: the first line of standard input, which a backend writes;
    the rest of standard input is left to the role: see ``serve_role(lifeline=...)``). Raises ValueError
    if it is not a token as ``new_role_token`` makes them."""
    text = sys.stdin.readline() if source == "-" else Path(source).read_text(encoding="ascii")
    token = text.strip()
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"the role token from {source!r} is not 64 hex digits")
    return token


def _given(metadata: Any) -> bytes:
    for key, value in metadata or ():
        if key == TOKEN_METADATA:
            return value.encode() if isinstance(value, str) else bytes(value)
    return b""


def has_credential(metadata: Any, token: str) -> bool:
    """Whether call ``metadata`` carries ``token`` (constant-time comparison)."""
    return hmac.compare_digest(_given(metadata), token.encode())


def _refuse(request: Any, context: grpc.ServicerContext) -> Any:
    context.abort(
        grpc.StatusCode.UNAUTHENTICATED, f"role calls need this job's credential ({TOKEN_METADATA})"
    )


def _refusing(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that refuses the call. No request deserializer: the
    refused bytes are never parsed."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse)
    return grpc.unary_unary_rpc_method_handler(_refuse)


class RoleAuthInterceptor(grpc.ServerInterceptor):
    """Refuses every call without the job's token with UNAUTHENTICATED, before its handler runs."""

    def __init__(self, token: str) -> None:
        if not _TOKEN.fullmatch(token):  # an empty token would match a call that sends none
            raise ValueError("a role server needs a 64-hex-digit token")
        self._token = token

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method == HEALTH_METHOD:
            return handler  # unknown methods get gRPC's own UNIMPLEMENTED; Health guards itself
        if has_credential(handler_call_details.invocation_metadata, self._token):
            return handler
        return _refusing(handler)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(
        self, details: grpc.ClientCallDetails, metadata: tuple[tuple[str, str | bytes], ...]
    ) -> None:
        self.method, self.timeout, self.credentials = details.method, details.timeout, details.credentials
        self.wait_for_ready, self.compression = details.wait_for_ready, details.compression
        self.metadata = metadata


class TokenMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the job's token (and any ``extra`` pairs: the generation) to every call made on a channel
    (``transport.rpc.open_channel``)."""

    def __init__(self, token: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self._pairs = [(TOKEN_METADATA, token), *extra]

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _ClientCallDetails(details, (*(details.metadata or ()), *self._pairs))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

"""The REST edge: the bearer token and the body limit, enforced before the app sees a byte of the body.

FastAPI reads and parses a request's body before it solves dependencies, so a token checked only by a
dependency is checked after an unauthenticated client has had its body buffered and parsed, and a limit
on ``Content-Length`` alone lets a chunked (or lying) body through whole. ``EdgeGuard`` is a pure ASGI
middleware (not ``BaseHTTPMiddleware``, which buffers) in front of the app instead:

- a /v1 request needs ``Authorization: Bearer <token>``, checked from the headers in constant time and
  answered 401 before any body byte is received; the open routes (/healthz, /metrics, the OpenAPI
  document and its pages, the dashboard's page at / and /jobs/<id> and its files under /dashboard/,
  which hold no data and read /v1 with the token the user gives them) need none;
- a body is counted as it streams in: a declared ``Content-Length`` over the limit is answered 413 at
  once, and a body that passes the limit, however it is framed, is answered 413 as soon as it does,
  without reading the rest.

Starlette's own ``RequestBodyLimitMiddleware`` would sit outside this one (FastAPI places it before the
user's middleware, so it would count bodies of unauthenticated requests), answers in plain text rather
than our error shape, and keeps the connection open.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weightstream.jobs.api.errors import error_response

__all__ = ["EdgeGuard", "bearer_matches", "is_protected"]

UNAUTHORIZED = "a valid 'Authorization: Bearer <token>' header is required"

# An early answer leaves the rest of the body unread. On a kept-alive connection uvicorn would go on
# reading that rest only to throw it away; "Connection: close" makes it drop the connection instead.
_CLOSE = {"Connection": "close"}


def is_protected(path: str) -> bool:
    """Whether ``path`` is under /v1 (every route there needs the token, unknown ones included, so that
    a client without it learns nothing about which routes exist)."""
    return path == "/v1" or path.startswith("/v1/")


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (the scheme case-insensitive, as
    RFC 7235 has it). SHA-256 digests are compared in constant time: equal lengths, so not even the
    token's length leaks through timing."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    expected = hashlib.sha256(token.encode()).digest()
    same = hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), expected)
    return same and scheme.lower() == "bearer" and bool(token)


class BodyTooLarge(Exception):
    """Raised from ``receive`` once a body has passed the limit, to stop the app reading it."""


class EdgeGuard:
    """``app`` behind the token check for /v1 and a ``max_body_bytes`` limit on every request body."""

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int) -> None:
        self.app, self.token, self.max_body_bytes = app, token, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan; the API has no websockets
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if is_protected(scope["path"]) and not bearer_matches(headers.get("authorization"), self.token):
            extra = {"WWW-Authenticate": "Bearer", **(_CLOSE if _has_body(headers) else {})}
            await error_response(401, "unauthorized", UNAUTHORIZED, headers=extra)(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a ``receive`` that counts body bytes and answers 413 past the limit."""
        received = 0
        started = False  # the app has begun its response: too late for a 413
        answered = False  # our 413 has gone out: whatever the app sends after it is dropped

        async def counted_receive() -> Message:
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    if not started and not answered:
                        await self._too_large(scope, receive, send)
                        answered = True
                    raise BodyTooLarge(f"{received} bytes received, over {self.max_body_bytes}")
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:  # e.g. the 400 FastAPI makes of the BodyTooLarge it caught while reading
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except BodyTooLarge:
            if not answered:  # the response had started: nothing to answer with, so fail loudly
                raise

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"request bodies are limited to {self.max_body_bytes} bytes"
        await error_response(413, "too_large", message, headers=_CLOSE)(scope, receive, send)


def _has_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")

"""Where the client's settings come from: the service's URL and the API token, each with its source, so
that ``wsctl config view`` can say which one is in effect and why."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DEFAULT_URL", "TOKEN_ENV", "URL_ENV", "Settings", "masked", "resolve_settings"]

URL_ENV, TOKEN_ENV = "WEIGHTSTREAM_URL", "WEIGHTSTREAM_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8080"  # `weightstream serve`'s own default


@dataclass(frozen=True)
class Settings:
    url: str  # without a trailing slash
    url_source: str  # what set it: "--url" (or the library's "url="), "$WEIGHTSTREAM_URL" or "default"
    token: str | None
    token_source: str | None  # None when no token is set


def resolve_settings(
    url: str | None = None, token: str | None = None, given_as: tuple[str, str] = ("url=", "token=")
) -> Settings:
    """An explicit ``url`` / ``token`` first, then the environment, then the default URL (a token has
    none). ``given_as`` names the explicit ones in the sources (the CLI passes its option's name)."""
    if url:
        url_source = given_as[0]
    elif os.environ.get(URL_ENV):
        url, url_source = os.environ[URL_ENV], f"${URL_ENV}"
    else:
        url, url_source = DEFAULT_URL, "default"
    if token:
        token_source: str | None = given_as[1]
    elif os.environ.get(TOKEN_ENV):
        token, token_source = os.environ[TOKEN_ENV], f"${TOKEN_ENV}"
    else:
        token, token_source = None, None
    return Settings(url.rstrip("/"), url_source, token, token_source)


def masked(token: str) -> str:
    """A token as it may be shown: none of its characters (not even a few: shown in a terminal, a
    screenshot or a support ticket, part of a token is part of the secret)."""
    return "*" * 8

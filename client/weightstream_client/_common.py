"""What every `wsctl` verb shares: the consoles, the --url option, a client, and errors as exit codes."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from weightstream_client._client import ApiError, Client

__all__ = ["JobId", "Url", "connect", "err", "fail", "out", "parse_labels"]

out, err = Console(), Console(stderr=True)
Url = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="service URL (default: $WEIGHTSTREAM_URL, else http://127.0.0.1:8080)",
        show_default=False,
    ),
]
JobId = Annotated[str, typer.Argument(help="job id")]


def connect(url: str | None) -> Client:
    """A client of the service (``url``, else $WEIGHTSTREAM_URL), or exit 2 without a token."""
    try:
        return Client(url)
    except ValueError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def fail(e: Exception) -> typer.Exit:
    """Say what went wrong on stderr, on as few lines as it takes; exit 2 when the request was at fault
    (fixing it is the user's move), 1 otherwise."""
    err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
    return typer.Exit(2 if isinstance(e, ApiError) and e.status in (400, 401, 404, 409, 413, 422) else 1)


def parse_labels(items: list[str], param_hint: str = "--label") -> dict[str, str]:
    """``key=value`` items as a dict (the value may hold '='; the key may not be empty)."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint=param_hint)
        labels[key] = value
    return labels

"""What `weightstream serve` tells its operator: where everything is once it listens, and what happens to
the jobs when it is told to stop. Pure functions of the service's settings; the command prints them.

Plain lines, never a secret: the API token is named by where it came from, not shown, since this output
usually ends up in a log (journald, ``kubectl logs``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STOPPED", "ServeBanner", "base_url", "stopping_lines"]


def base_url(host: str, port: int) -> str:
    """The URL a browser on this machine opens for a server listening on ``host``: a wildcard address
    (0.0.0.0, ::) is reached through loopback; an IPv6 address goes in brackets."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a name, such as localhost
        return f"http://{host}:{port}"
    if ip.is_unspecified:
        ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
    return f"http://[{ip}]:{port}" if ip.version == 6 else f"http://{ip}:{port}"


@dataclass(frozen=True)
class ServeBanner:
    """The facts the start lines show."""

    host: str
    port: int  # the REST port actually bound
    grpc_address: str
    backend: str
    slots: int
    data_dir: Path
    data_roots: Sequence[Path]
    token_source: str  # "$WEIGHTSTREAM_TOKEN" or "--token"
    docs_path: str | None = "/docs"

    def lines(self) -> list[str]:
        url = base_url(self.host, self.port)
        wildcard = self.host in ("0.0.0.0", "::")
        roots = ", ".join(str(r) for r in self.data_roots)
        return [
            f"weightstream service: {self.backend} backend, {self.slots} CS-2 slots, listening on "
            f"{self.host}:{self.port}{' (every interface)' if wildcard else ''}",
            f"  dashboard:   {url}/  (asks for the API token; `wsctl dashboard` prints a link carrying it)",
            f"  REST API:    {url}/v1" + (f"  (OpenAPI: {url}{self.docs_path})" if self.docs_path else ""),
            f"  gRPC API:    {self.grpc_address}",
            f"  API token:   from {self.token_source}; every /v1 call and the dashboard need it "
            f"(clients: WEIGHTSTREAM_URL={url} and WEIGHTSTREAM_TOKEN)",
            f"  job store:   {self.data_dir}  (job <id> writes only in {self.data_dir / 'jobs'}/<id>)",
            f"  data roots:  {roots}  (jobs read data only under these; a relative data_dir is taken "
            "from the first)",
            "Ctrl-C or SIGTERM stops it: running jobs go back to the queue and resume from their last "
            "checkpoint when the service starts again on this data dir.",
        ]


def stopping_lines(signal_name: str, running: Sequence[str], queued: int) -> list[str]:
    """What a stop signal does, said when it arrives: running jobs (their ids) are stopped and queued
    again, queued ones stay queued, new submissions are refused."""
    now = (
        f"{len(running)} ({', '.join(running)}), stopped now and queued again: each resumes from its last "
        "checkpoint when the service starts again on this data dir"
        if running
        else "none"
    )
    return [
        f"{signal_name}: stopping; new submissions are refused.",
        f"  running jobs: {now}",
        f"  queued jobs:  {queued or 'none'}{', kept in the queue' if queued else ''}",
    ]


STOPPED = "weightstream service stopped."

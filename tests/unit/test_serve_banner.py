"""What `weightstream serve` says at start and at a stop signal (``serve_banner``), as pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.serve_banner import ServeBanner, base_url, stopping_lines


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("0.0.0.0", "http://127.0.0.1:8080"),  # every interface: a browser here goes through loopback
        ("::", "http://[::1]:8080"),
        ("::1", "http://[::1]:8080"),
        ("10.1.2.3", "http://10.1.2.3:8080"),
        ("localhost", "http://localhost:8080"),
    ],
)
def test_the_url_is_one_a_browser_here_opens(host: str, url: str) -> None:
    assert base_url(host, 8080) == url


def test_the_start_lines_say_where_everything_is_and_never_the_token() -> None:
    banner = ServeBanner(
        "0.0.0.0", 8080, "0.0.0.0:50050", "local", 4, Path("/srv/ws"),
        (Path("/srv/ws/datasets"), Path("/corpora")), "$WEIGHTSTREAM_TOKEN",
    )  # fmt: skip
    text = "\n".join(banner.lines())
    assert "dashboard:   http://127.0.0.1:8080/ " in text and "wsctl dashboard" in text
    assert "REST API:    http://127.0.0.1:8080/v1  (OpenAPI: http://127.0.0.1:8080/docs)" in text
    assert "listening on 0.0.0.0:8080 (every interface)" in text
    assert "data roots:  /srv/ws/datasets, /corpora  (jobs read data only under these" in text
    assert "API token:   from $WEIGHTSTREAM_TOKEN" in text
    assert "resume from their last checkpoint" in text.splitlines()[-1]


def test_a_stop_signal_says_what_happens_to_each_kind_of_job() -> None:
    lines = stopping_lines("SIGTERM", ["a1", "b2"], 3)
    assert lines[0] == "SIGTERM: stopping; new submissions are refused."
    assert lines[1].startswith("  running jobs: 2 (a1, b2), stopped now and queued again: each resumes")
    assert lines[2] == "  queued jobs:  3, kept in the queue"
    assert stopping_lines("SIGINT", [], 0)[1:] == ["  running jobs: none", "  queued jobs:  none"]

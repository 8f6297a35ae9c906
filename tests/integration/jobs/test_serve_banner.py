"""`weightstream serve` as its operator sees it: once it listens it prints where the dashboard, the APIs
and the data roots are; at SIGTERM it says it is stopping and what becomes of the jobs, then that it
stopped. The token itself is never printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.jobs.live_api import TOKEN, ServeProcess


# a real service started and stopped with SIGTERM (~6 s); its lines are unit-tested (test_serve_banner)
@pytest.mark.slow
def test_serve_prints_where_everything_is_and_what_a_stop_does(tmp_path: Path) -> None:
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    log = tmp_path / "serve.log"
    served = ServeProcess(tmp_path / "data", log)  # the default data root: <data-dir>/datasets
    try:
        text = log.read_text()
        url = served.url
        assert f"dashboard:   {url}/ " in text, text
        assert f"REST API:    {url}/v1" in text
        roots = re.search(r"data roots:  (\S+)", text)
        assert roots and roots.group(1) == str((tmp_path / "data" / "datasets").resolve()), text
        assert "API token:   from $WEIGHTSTREAM_TOKEN" in text and TOKEN not in text
    finally:
        served.stop()
    assert served.proc.returncode == 0
    after = log.read_text().splitlines()
    said = after.index("SIGTERM: stopping; new submissions are refused.")
    assert after[said + 1 : said + 3] == ["  running jobs: none", "  queued jobs:  none"]
    assert after[-1] == "weightstream service stopped."

    served = ServeProcess(tmp_path / "data", tmp_path / "again.log", "--data-root", str(corpora))
    served.stop()
    assert f"data roots:  {corpora.resolve()}  (" in (tmp_path / "again.log").read_text()

"""bench/replicas.py's smoke run end to end (slow): replicas and snapshots change no number, and a replica
is a second copy of every shard's memory."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _load() -> ModuleType:
    return load_bench("replicas")


replicas = _load()


@pytest.mark.slow  # ~25 s: three 20-step runs of a tiny model
def test_smoke_run_measures_each_way_against_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    result = replicas.main(["--smoke"])
    assert json.loads(capsys.readouterr().out) == result
    assert set(result["ways"]) == {"none", "snapshots", "replicas"}
    assert all(way["bitwise_equal"] for way in result["ways"].values())
    # a replica holds its shard's state again, in a process of its own
    assert result["ratio_to_none"]["replicas"]["memoryx_rss_peak"] > 1.5
    assert 0.8 < result["ratio_to_none"]["snapshots"]["memoryx_rss_peak"] < 1.25

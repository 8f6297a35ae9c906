"""bench/hosts.py end to end on a tiny job (``--quick``): one JSON line with the three figures, each worker
on a host of its own, and nothing of its hosts or its Slurm cluster left on the machine."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.bench_module import run_bench_json

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

KEYS = ("broadcast_link_ratio_1gbit", "cross_host_step_ratio", "simulate_max_error")


def _processes_naming(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` (a host's PID 1 names its hosts file there)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(path) in cmdline and "pytest" not in cmdline:
                found.append(cmdline)
    return found


def test_quick_run_prints_the_three_figures_and_leaves_nothing(
    hosts_possible: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hosts' and the runs' directories land here: a short path, as munged's socket path must be
    work = Path(tempfile.mkdtemp(prefix="bh", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(work))
    try:
        out = run_bench_json("hosts", ["--quick"], tmp_path, timeout=600)
        left = list(work.iterdir())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert out["bench"] == "hosts" and out["source"] == "run"
    for key in KEYS:
        assert isinstance(out[key], float) and out[key] >= 0, (key, out[key])
    assert out["broadcast"]["busiest"] == "h2"  # SwarmX's host: it sends every block once per child
    sent = out["broadcast"]["link_sent_bytes"]
    assert sent["h2"] >= 1.9 * sent["h1"]  # two children: SwarmX's link carries twice MemoryX's
    placed = out["placement"]
    assert placed["worker-0"] != placed["worker-1"]
    assert {placed["memoryx-0"], placed["swarmx-0"]}.isdisjoint({placed["worker-0"], placed["worker-1"]})
    steps = out["step_s"]
    assert out["cross_host_step_ratio"] == pytest.approx(steps["across_hosts"] / steps["one_host"], abs=2e-3)
    errors = out["simulate_error"]
    assert set(errors) == {"unlimited", "1gbit"}
    assert out["simulate_max_error"] == pytest.approx(max(errors.values()), abs=1e-3)
    assert left == [] and _processes_naming(work) == []

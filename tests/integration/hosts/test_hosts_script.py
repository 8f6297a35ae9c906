"""scripts/hosts.py as a developer runs it: up (with Slurm), run inside a host and at the switch, down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import running

# the script as a developer runs it (~3 s): in the slow phase, which CI runs too
pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.usefixtures("hosts_possible")]

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "hosts.py"
TIMEOUT = 60


def script(state: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--state", str(state), *args], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_up_run_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    up = subprocess.Popen([sys.executable, str(SCRIPT), "--state", str(state), "up", "2", "--rate", "1gbit",
                           "--slurm"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert up.stdout is not None
        lines = [up.stdout.readline() for _ in range(4)]  # times, a line per host, how to stop
        assert lines[0].startswith("2 hosts up in") and "Slurm in" in lines[0], lines
        assert lines[1].split() == ["h1", "198.18.0.11", "(outgoing", "1gbit)"]
        record = json.loads(state.read_text())
        assert script(state, "run", "h2", "--", "hostname") == "h2"
        assert script(state, "run", "switch", "--", "srun", "-w", "h1", "hostname") == "h1"
        script(state, "down")
        assert up.wait(timeout=TIMEOUT) == 0
        assert up.communicate(timeout=TIMEOUT)[0] == "down: nothing left behind\n"
    finally:
        if up.poll() is None:
            up.terminate()
        up.communicate(timeout=TIMEOUT)  # closes its pipe
    assert not state.exists()
    assert [pid for pid in (record["switch_pid"], *(h["init_pid"] for h in record["hosts"].values()))
            if running(pid)] == []  # fmt: skip

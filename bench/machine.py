"""Where and when a bench ran, in the same fields on every bench's JSON line.

A ratio measured on one machine says little about another (a 2-core EPYC and a 2-core Xeon differ by 2x in
matrix speed), so every line a bench prints, and every record kept in ``bench/results/``, names its
machine, its date, the command that produced it and the commit it ran. ``record`` puts them in front of
a bench's figures::

    print(json.dumps(record("kernels", {"config": ..., "units": ...})))
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# the fields that name a machine: records with the same values ran on the same kind of machine
MACHINE_KEYS = ("cpu", "cores", "ram_gib")


def cpu_model(cpuinfo: str) -> str:
    """The CPU's name from the text of ``/proc/cpuinfo`` (its first ``model name``), else the platform's."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def ram_gib(meminfo: str) -> float | None:
    """Total RAM in GiB, to one decimal, from the text of ``/proc/meminfo`` (None without a MemTotal)."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) * 1024 / 2**30, 1)  # the kernel counts kB (KiB)
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:  # not Linux: the fields fall back or stay None
        return ""


def machine() -> dict[str, Any]:
    """This machine: CPU model, logical cores, RAM in GiB, and the Python that ran the bench."""
    return {
        "cpu": cpu_model(_read("/proc/cpuinfo")),
        "cores": os.cpu_count(),
        "ram_gib": ram_gib(_read("/proc/meminfo")),
        "python": platform.python_version(),
    }


def git_commit(root: Path = ROOT) -> str | None:
    """The checked-out commit's full hash, with ``-dirty`` when tracked files differ from it; None outside
    a git checkout (a bench copied elsewhere)."""
    try:
        r = subprocess.run(
            ["git", "describe", "--always", "--abbrev=40", "--dirty", "--match=^"],  # no tag matches "^"
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return r.stdout.strip()


def command(argv: list[str] | None = None) -> str:
    """The command line as a reader would type it again: ``python bench/<name>.py ARGS``."""
    argv = sys.argv if argv is None else argv
    return shlex.join(["python", f"bench/{Path(argv[0]).name}", *argv[1:]])


def record(bench: str, figures: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """One record: ``bench``, the UTC ``date`` (YYYY-MM-DD), ``command``, ``commit``, ``machine`` and
    ``source`` ("run": printed by the bench), then ``figures``. A ``machine`` dict in ``figures`` adds
    to this machine's fields (a bench's library versions, the load average)."""
    extra = figures.get("machine", {})
    return {
        "bench": bench,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "command": command(argv),
        "commit": git_commit(),
        "machine": {**machine(), **extra},
        "source": "run",
        **{k: v for k, v in figures.items() if k not in ("bench", "machine")},
    }

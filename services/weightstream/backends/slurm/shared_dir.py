"""The check, before any role starts, that ``model_dir`` is on a filesystem every node of the job shares: the
roles write their logs, ready files and checkpoint shards there, and the coordinator reads them.

One task on each node writes ``<run_dir>/.probe-<tag>-<node>`` holding its node's name (the srun of
``commands.probe_command``), and this process reads each back.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from weightstream.backends.base import BackendError

__all__ = ["PROBE_TIMEOUT_S", "check_shared_dir"]

PROBE_TIMEOUT_S = 60.0


def check_shared_dir(
    argv: Sequence[str], run_dir: Path, nodes: Sequence[str], tag: str, env: Mapping[str, str], where: str
) -> None:
    """Run ``argv`` (the probe's srun), then read each of ``nodes``' file back from ``run_dir``; raise
    BackendError naming the nodes that did not run it or whose file this machine does not see (``where``:
    the Slurm job, for the message)."""
    done: subprocess.CompletedProcess[str] | None = None
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=dict(env), check=False
        )
        said = " ".join(done.stderr.split())
    except subprocess.TimeoutExpired:
        said = f"no answer within {PROBE_TIMEOUT_S:.0f} s"
    blind = []
    for node in nodes:
        probe = run_dir / f".probe-{tag}-{node}"
        try:
            seen = probe.read_text()
            probe.unlink()
        except OSError:
            seen = ""
        if seen != node:
            blind.append(node)
    if blind and (done is None or done.returncode != 0):
        raise BackendError(
            f"node {', '.join(blind)} did not run the check that it can write to {run_dir}{where}: {said}"
        )
    if blind:
        raise BackendError(
            f"model_dir must be on a filesystem every node shares: node {', '.join(blind)} wrote to "
            f"{run_dir}, and this machine does not see what it wrote{where}"
        )

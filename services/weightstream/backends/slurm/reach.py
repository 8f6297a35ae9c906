"""Whether a node still answers: what tells a role that died on a live node from a node that is gone, and
the end of a lost role's srun either way.

When a role is lost, Slurm cannot say at once whether its node went with it: slurmctld marks a node not
responding only after a failed ping (every SlurmdTimeout/3) and down after SlurmdTimeout more, 15 s and
more on the test cluster. The role's own address says within a second: a TCP connection to it is
accepted (the process still listens, hung or being killed) or refused (the process is gone, the node's
kernel answers) on a live node, and meets silence or "no route to host" when the node is dead or cut off.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["REACH_TIMEOUT_S", "answers", "end_sruns"]

K = TypeVar("K", bound=Hashable)

REACH_TIMEOUT_S = 1.0  # a live node's kernel answers a connection in well under a millisecond


def answers(address: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Whether the host of ``address`` ("host:port", a role's) answers a TCP connection to it within
    ``timeout_s`` seconds, by accepting or refusing it."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):  # timed out, unreachable, or no address to try
        return False


def end_sruns(
    sruns: Mapping[K, subprocess.Popen[bytes]], addresses: Mapping[K, str | None], grace_s: float
) -> set[K]:
    """Wait for each of ``sruns`` (their steps cancelled) to end: ``grace_s`` at most for all of them, and
    not at all for one whose node does not answer at its role's address (``addresses``; None: not known,
    waited for). Kills those that have not ended, and returns their keys: their nodes do not answer. An
    srun waits for a node out of reach until slurmctld marks it down; the node may never answer."""
    known = {k: a for k, a in addresses.items() if a is not None and k in sruns}
    with ThreadPoolExecutor(max(1, len(known))) as pool:
        silent = {k for k, ok in zip(known, pool.map(answers, known.values()), strict=True) if not ok}
    deadline = time.monotonic() + grace_s
    stuck: set[K] = set()
    for key, srun in sruns.items():
        try:
            srun.wait(timeout=0.0 if key in silent else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.add(key)
            srun.kill()
            srun.wait(timeout=5)
    return stuck

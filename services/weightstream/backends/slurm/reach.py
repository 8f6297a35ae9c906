"""Whether a node still answers: what tells a role that died on a live node from a node that is gone.

When a role is lost, Slurm cannot say at once whether its node went with it: slurmctld marks a node not
responding only after a failed ping (every SlurmdTimeout/3) and down after SlurmdTimeout more, 15 s and
more on the test cluster. The role's own address says within a second: a TCP connection to it is
accepted (the process still listens, hung or being killed) or refused (the process is gone, the node's
kernel answers) on a live node, and meets silence or "no route to host" when the node is dead or cut off.
"""

from __future__ import annotations

import socket

__all__ = ["REACH_TIMEOUT_S", "answers"]

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

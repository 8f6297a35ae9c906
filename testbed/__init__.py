"""Emulated machines for tests and benchmarks: hosts made of namespaces, and a real Slurm cluster on them.

Not part of the weightstream distribution: tests import it from the repository root, and bench/ and
scripts/ put the root on their path. Root only; ``unavailable()`` says why not where it cannot run.
"""

from testbed.hosts import (
    BRIDGE_ADDRESS,
    EmulatedHosts,
    Host,
    HostsUnavailable,
    host_command,
    parse_rate,
    running,
    unavailable,
)

__all__ = [
    "BRIDGE_ADDRESS",
    "EmulatedHosts",
    "Host",
    "HostsUnavailable",
    "host_command",
    "parse_rate",
    "running",
    "unavailable",
]

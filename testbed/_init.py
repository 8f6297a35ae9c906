"""PID 1 of an emulated host (or the holder of the switch's network namespace): sets the host up, says
"ready" on stdout, then reaps orphans until it is killed.

    python _init.py host NAME HOSTS_FILE     (inside fresh net, PID, mount, UTS and IPC namespaces)
    python _init.py switch                   (inside a fresh network namespace only)

Run by hosts.py through ``unshare``; not imported. Its mount namespace is a private copy of the machine's:
a host shares the machine's files (as a cluster's nodes share a network filesystem) except /proc (its own
PIDs), /dev/shm (its own shared memory) and /etc/hosts (the cluster's names).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

_MS_BIND = 4096
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if (
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def main() -> None:
    # dies with the process that made it (unshare, itself dying with the Python that started it), so a
    # crashed test or script leaves no host behind
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if sys.argv[1] == "host":
        name, hosts_file = sys.argv[2], sys.argv[3]
        socket.sethostname(name)
        _mount("tmpfs", "/dev/shm", "tmpfs", 0, "mode=1777")
        _mount(hosts_file, "/etc/hosts", None, _MS_BIND)
    # PID 1 ignores signals it has no handler for: SIGTERM ends the host, as SIGKILL does
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.close(1)
    # orphans of the host's daemons are re-parented here: reap them. SIGCHLD stays blocked and is taken
    # with sigwait, so a child that exits between two waits is never missed
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigwait({signal.SIGCHLD})


if __name__ == "__main__":
    main()

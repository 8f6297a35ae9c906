"""Emulated hosts: separate machines made of Linux namespaces on this one, for tests and benchmarks.

Each host is a process tree in its own network, PID, mount, UTS and IPC namespaces: its own address on a
bridge, its own hostname, its own /proc and /dev/shm (so a host cannot open another host's memfds), and
every other host reachable by name through its /etc/hosts. The bridge lives in a "switch" network namespace
of its own, so the machine's own networking is never touched; hosts get no default route. Addresses come
from 198.18.0.0/15, the range set aside for network benchmarks, and stay inside namespaces made here.

Every namespace is held by a process that dies with the Python process that made it (PR_SET_PDEATHSIG), so
even a crashed run leaves no host, link or process behind (only its directory, $TMPDIR/wsh<hex>-*, when it
was SIGKILLed); ``close`` ends them all, waits until they are gone and removes the directory.

    with EmulatedHosts(4, rate="1gbit") as cluster:
        cluster["h2"].run(["hostname"])      # runs inside h2
        cluster.kill("h3")                   # every process on h3 dies with its PID 1
        cluster.cut("h4"); cluster.restore("h4")
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "BRIDGE_ADDRESS",
    "EmulatedHosts",
    "Host",
    "HostsUnavailable",
    "parse_rate",
    "running",
    "unavailable",
]

BRIDGE_ADDRESS = "198.18.0.1"  # the switch's own address on the bridge: the machine itself, seen from a host
_PREFIX_LEN = 24
_FIRST_HOST = 11  # h1 is 198.18.0.11
_MAX_HOSTS = 200
_INIT = Path(__file__).with_name("_init.py")
_TOOLS = ("ip", "tc", "unshare", "nsenter")
_START_TIMEOUT = 10.0  # seconds for a host's PID 1 to set its namespaces up (a few ms when idle)
_PR_SET_PDEATHSIG = 1


class HostsUnavailable(RuntimeError):
    """Emulated hosts cannot be made on this machine (not root, a tool or a namespace kind missing)."""


@cache
def unavailable() -> str | None:
    """Why emulated hosts cannot be made here, or None when they can (tried once per process)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (namespaces, veth links, tc)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux)"
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount", "--uts", "--ipc", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"this kernel refuses new namespaces: {probe.stderr.strip()}"
    return None


def parse_rate(rate: str) -> int:
    """A link rate in tc's notation ("100mbit", "1gbit", "500kbit") as bits per second."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.strip().lower())
    if match is None:
        raise ValueError(f"link rate {rate!r}: expected a number and kbit, mbit, gbit or bit, e.g. '1gbit'")
    return int(float(match[1]) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match[2]])


def die_with_parent() -> None:
    """For Popen's preexec_fn: the child gets SIGKILL when the thread that started it ends."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _start_init(unshare_flags: Sequence[str], args: Sequence[str]) -> tuple[subprocess.Popen[str], int]:
    """Start _init.py under ``unshare``; returns (the unshare process, the root-namespace PID of the
    process that holds the namespaces) once it has said "ready"."""
    proc = subprocess.Popen(
        ["unshare", *unshare_flags, sys.executable, "-I", str(_INIT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until ready, or EOF if it failed
    if line != "ready\n":
        proc.kill()
        _, err = proc.communicate(timeout=_START_TIMEOUT)
        raise HostsUnavailable(f"a namespace holder did not start ({' '.join(unshare_flags)}): {err.strip()}")
    if "--fork" not in unshare_flags:
        return proc, proc.pid
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return proc, int(children[0])  # with --fork, unshare's only child is the host's PID 1


def host_command(init_pid: int, argv: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """``argv`` wrapped to run inside the host whose PID 1 is ``init_pid`` (root namespace), in ``cwd``."""
    wd = os.fspath(cwd) if cwd is not None else os.getcwd()
    return ["nsenter", "-t", str(init_pid), "-n", "-p", "-m", "-u", "-i", f"--wd={wd}", *argv]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, already dead and waiting to be reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Host:
    """One emulated host: its name, its address, and the root-namespace PID of its PID 1."""

    def __init__(self, name: str, address: str, hosts_file: Path) -> None:
        self.name = name
        self.address = address
        self._holder, self.init_pid = _start_init(
            [
                "--net",
                "--pid",
                "--fork",
                "--mount",
                "--uts",
                "--ipc",
                "--mount-proc",
                "--propagation",
                "private",
            ],
            ["host", name, str(hosts_file)],
        )
        self._pid_ns = os.readlink(f"/proc/{self.init_pid}/ns/pid")

    def command(self, argv: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """``argv`` wrapped so that it runs inside this host (all five namespaces), in ``cwd`` (default:
        the caller's working directory; the files are the machine's)."""
        return host_command(self.init_pid, argv, cwd)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """subprocess.run inside this host (same keyword arguments; ``cwd`` as in ``command``)."""
        return subprocess.run(self.command(argv, kwargs.pop("cwd", None)), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """subprocess.Popen inside this host. The Popen is nsenter's, which waits for the command;
        ``inner_pid`` gives the command's own PID."""
        return subprocess.Popen(self.command(argv, kwargs.pop("cwd", None)), **kwargs)

    @staticmethod
    def inner_pid(proc: subprocess.Popen[Any], timeout: float = _START_TIMEOUT) -> int:
        """The root-namespace PID of the command that ``popen`` started (nsenter's child)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # nsenter itself already gone: poll says so below
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                if children:
                    return int(children[0])
            if proc.poll() is not None:
                raise ProcessLookupError(f"nsenter {proc.pid}'s command already ended ({proc.returncode})")
            time.sleep(0.005)  # nsenter forks within microseconds of starting; this loop rarely turns
        raise TimeoutError(f"nsenter {proc.pid} started no command within {timeout} s")

    def stop(self, proc: subprocess.Popen[Any], timeout: float = _START_TIMEOUT) -> None:
        """SIGKILL the command that ``popen`` started, and wait for it (its pipes closed)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.inner_pid(proc), signal.SIGKILL)
        proc.communicate(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self._holder.poll() is None

    def processes(self) -> list[int]:
        """Root-namespace PIDs of every process on this host (its PID 1 included)."""
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.readlink(f"/proc/{entry.name}/ns/pid") == self._pid_ns:
                        pids.append(int(entry.name))
                except OSError:  # gone meanwhile, or a kernel thread
                    pass
        return pids

    def kill(self, timeout: float = _START_TIMEOUT) -> None:
        """SIGKILL the host's PID 1: the kernel kills every other process of its PID namespace, and the
        network namespace (with the host's end of its link) goes when they are gone. Waits for that."""
        if self.alive:
            os.kill(self.init_pid, signal.SIGKILL)
        self._holder.communicate(timeout=timeout)


class EmulatedHosts:
    """N emulated hosts h1..hN on one switch; a context manager (``close`` on exit).

    ``rate``: each host's outgoing link rate in tc's notation ("1gbit"), None for unlimited. ``tag`` names
    this run's files (default: random), so parallel runs never collide.
    """

    def __init__(self, count: int, rate: str | None = None, tag: str | None = None) -> None:
        reason = unavailable()
        if reason is not None:
            raise HostsUnavailable(reason)
        if not 1 <= count <= _MAX_HOSTS:
            raise ValueError(f"host count {count}: expected 1 to {_MAX_HOSTS}")
        self.tag = tag or f"wsh{secrets.token_hex(3)}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.hosts: list[Host] = []
        self._switch: subprocess.Popen[str] | None = None
        try:
            self._switch, self.switch_pid = _start_init(["--net"], ["switch"])
            self._switch_ip(
                [
                    "link add br0 type bridge",
                    f"addr add {BRIDGE_ADDRESS}/{_PREFIX_LEN} dev br0",
                    "link set br0 up",
                    "link set lo up",
                ]
            )
            names = [(f"h{i}", f"198.18.0.{_FIRST_HOST + i - 1}") for i in range(1, count + 1)]
            hosts_file = self.dir / "hosts"
            hosts_file.write_text(
                "127.0.0.1 localhost\n"
                f"{BRIDGE_ADDRESS} {socket.gethostname().split('.')[0]}\n"
                + "".join(f"{address} {name}\n" for name, address in names)
            )
            for name, address in names:
                self.hosts.append(Host(name, address, hosts_file))
                self._wire(self.hosts[-1])
                if rate is not None:
                    self.set_rate(name, rate)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> EmulatedHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no emulated host {name!r}: the hosts are {', '.join(h.name for h in self.hosts)}")

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def switch_command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run in the switch's network namespace (the machine's PIDs and files, the
        bridge's address): where a controller that every host must reach runs."""
        return ["nsenter", "-t", str(self.switch_pid), "-n", *argv]

    def _switch_ip(self, commands: list[str]) -> None:
        subprocess.run(
            self.switch_command(["ip", "-batch", "-"]),
            input="\n".join(commands) + "\n",
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )

    def _wire(self, host: Host) -> None:
        # both ends made in the switch, the host's end then moved into the host as eth0: no link ever
        # appears in the machine's own namespace
        self._switch_ip(
            [
                f"link add {host.name} type veth peer name {host.name}-eth0",
                f"link set {host.name}-eth0 netns {host.init_pid}",
                f"link set {host.name} master br0 up",
            ]
        )
        subprocess.run(
            host.command(["ip", "-batch", "-"], cwd="/"),
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
            input=f"link set {host.name}-eth0 name eth0\n"
            f"addr add {host.address}/{_PREFIX_LEN} dev eth0\n"
            "link set eth0 up\nlink set lo up\n",
        )

    def set_rate(self, name: str, rate: str | None) -> None:
        """Limit host ``name``'s outgoing link to ``rate`` (tc notation), a token bucket; None lifts it."""
        host = self[name]
        if rate is None:
            argv = ["tc", "qdisc", "del", "dev", "eth0", "root"]
        else:
            # the bucket holds 10 ms of traffic, and at least 64 KiB: a whole segmentation-offload packet
            burst = max(64 * 1024, parse_rate(rate) // 8 // 100)
            argv = [
                "tc",
                "qdisc",
                "replace",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                str(burst),
                "latency",
                "50ms",
            ]
        subprocess.run(host.command(argv, cwd="/"), check=True, capture_output=True, timeout=30)

    def kill(self, name: str) -> None:
        """Kill host ``name``: every process on it dies (see Host.kill)."""
        self[name].kill()

    def cut(self, name: str) -> None:
        """Take host ``name``'s link down at the switch: nothing goes in or out until ``restore``."""
        self._switch_ip([f"link set {self[name].name} down"])

    def restore(self, name: str) -> None:
        self._switch_ip([f"link set {self[name].name} up"])

    def leftovers(self) -> list[str]:
        """What this run still has on the machine, described; [] once ``close`` has done its work."""
        found = []
        holders = [self.switch_pid] if self._switch is not None else []
        for pid in holders + [p for host in self.hosts for p in (host.init_pid, host._holder.pid)]:
            if running(pid):
                found.append(f"namespace holder {pid}")
        found += [f"process {pid} on {host.name}" for host in self.hosts for pid in host.processes()]
        if self.dir.exists():
            found.append(f"directory {self.dir}")
        for listing in (["ip", "netns", "list"], ["ip", "-o", "link", "show"]):
            out = subprocess.run(listing, capture_output=True, text=True, timeout=30, check=True).stdout
            found += [f"{' '.join(listing)}: {line}" for line in out.splitlines() if self.tag in line]
        return found

    def close(self) -> None:
        """Kill every host and the switch, wait until their processes are gone, remove this run's files."""
        for host in self.hosts:
            host.kill()
        if self._switch is not None and self._switch.poll() is None:
            self._switch.kill()
            self._switch.communicate(timeout=_START_TIMEOUT)
        shutil.rmtree(self.dir, ignore_errors=True)

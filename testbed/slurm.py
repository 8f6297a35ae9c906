"""A real Slurm cluster on emulated hosts: one munged, one slurmctld in the switch's network namespace, and
one ``slurmd -N <host>`` inside each host. Debian's packages (slurmctld, slurmd, slurm-client, munge).

Every file of the cluster (configuration, munge key and socket, state, spool, logs) lives in one directory
of its own, and every daemon runs in the foreground as a child of this process, so ``close`` stops each by
its PID and removes the directory. The machine's /etc/slurm and /etc/munge are never read: each command gets
``SLURM_CONF``. Ports are Slurm's defaults, but they never collide with another cluster's: slurmctld listens
inside this run's switch namespace and each slurmd inside its own host.

    with EmulatedHosts(4) as hosts, SlurmCluster(hosts) as slurm:
        slurm.run(["srun", "-w", "h2", "hostname"])    # prints h2
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from testbed.hosts import BRIDGE_ADDRESS, EmulatedHosts, Host, die_with_parent, running

__all__ = ["SlurmCluster", "SlurmUnavailable", "slurm_unavailable"]

_DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "srun", "scontrol")
# seconds without an answer before slurmctld marks a node DOWN; it pings every third of it. Short, so a
# killed host shows DOWN within seconds; long enough for a busy 2-core machine to answer every ping
SLURMD_TIMEOUT = 6
_READY_TIMEOUT = 45.0  # seconds for every node to come up idle (a few when the machine is idle)
_STOP_TIMEOUT = 10.0


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed, or the cluster did not come up (the message says which daemon)."""


@cache
def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (its commands missing), or None."""
    missing = [tool for tool in _DAEMONS if shutil.which(tool) is None]
    if missing:
        return (
            f"a Slurm cluster needs {', '.join(missing)}: apt-get install --no-install-recommends "
            "slurmctld slurmd slurm-client munge"
        )
    return None


def slurm_conf(cluster_dir: Path, hosts: EmulatedHosts, controller: str, munge_socket: Path) -> str:
    """slurm.conf for ``hosts``, every path inside ``cluster_dir``; ``controller``: the machine's short
    hostname (slurmctld refuses to start unless SlurmctldHost names the host it runs on)."""
    cpus = len(os.sched_getaffinity(0))  # each host has the machine's cores
    nodes = "".join(
        f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs={cpus} State=UNKNOWN\n"
        for h in hosts
    )
    return f"""\
ClusterName={hosts.tag}
SlurmctldHost={controller}({BRIDGE_ADDRESS})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={cluster_dir}/state
SlurmdSpoolDir={cluster_dir}/spool/%n
SlurmctldPidFile={cluster_dir}/slurmctld.pid
SlurmdPidFile={cluster_dir}/slurmd-%n.pid
SlurmctldLogFile={cluster_dir}/slurmctld.log
SlurmdLogFile={cluster_dir}/slurmd-%n.log
PlugStackConfig={cluster_dir}/plugstack.conf
# no systemd and no cgroup delegation here: processes are tracked through /proc, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# heterogeneous jobs are placed by the backfill scheduler alone: every second, not every 30
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT}
SlurmctldTimeout=10
MessageTimeout=5
KillWait=2
InactiveLimit=0
{nodes}PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """A Slurm cluster whose nodes are ``hosts`` (all of them, named as the hosts), up and idle once made;
    a context manager (``close`` on exit). ``run``/``popen`` run Slurm's commands where they reach it."""

    def __init__(self, hosts: EmulatedHosts) -> None:
        reason = slurm_unavailable()
        if reason is not None:
            raise SlurmUnavailable(reason)
        self.hosts = hosts
        self.dir = hosts.dir / "slurm"
        self._daemons: list[tuple[str, subprocess.Popen[bytes], int]] = []  # (name, Popen, its own PID)
        self._all: list[tuple[str, subprocess.Popen[bytes], int]] = []  # every daemon ever started
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for sub in ("state", "munge-key", "munge-run", *(f"spool/{h.name}" for h in self.hosts)):
            (self.dir / sub).mkdir(parents=True)
        # munged refuses a key directory others can read and a socket directory others can write
        (self.dir / "munge-key").chmod(0o700)
        (self.dir / "munge-run").chmod(0o755)
        key, munge_socket = self.dir / "munge-key" / "munge.key", self.dir / "munge-run" / "munge.socket"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=30
        )
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={self.dir}/munged.pid",
                f"--log-file={self.dir}/munged.log",
                f"--seed-file={self.dir}/munged.seed",
            ],
        )
        self._wait_for(munge_socket.exists, "munged's socket", "munged.log")
        conf = self.dir / "slurm.conf"
        conf.write_text(slurm_conf(self.dir, self.hosts, socket.gethostname().split(".")[0], munge_socket))
        (self.dir / "cgroup.conf").write_text("IgnoreSystemd=yes\n")  # read by slurmd; no systemd here
        (self.dir / "plugstack.conf").write_text("")
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        # nsenter into a network namespace alone execs the command: the Popen is slurmctld's own
        self._spawn("slurmctld", self.hosts.switch_command(["slurmctld", "-D", "-f", str(conf)]))
        for host in self.hosts:
            self._spawn(
                f"slurmd on {host.name}",
                host.command(["slurmd", "-D", "-N", host.name, "-f", str(conf)], cwd="/"),
                inner=True,
            )
        self._wait_for(
            lambda: self.node_states() == {h.name: "idle" for h in self.hosts},
            "every node idle",
            "slurmctld.log",
        )

    def _spawn(self, name: str, argv: list[str], inner: bool = False) -> None:
        """Start a daemon in the foreground; ``inner``: argv enters a host's PID namespace, so the Popen is
        nsenter's and the daemon its child."""
        proc = subprocess.Popen(
            argv,
            env=getattr(self, "env", None),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )  # a crashed run leaves no daemon
        pid = Host.inner_pid(proc) if inner else proc.pid
        self._daemons.append((name, proc, pid))
        self._all.append((name, proc, pid))

    def _wait_for(self, ready: Any, what: str, log: str) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not ready():
            for name, proc, _ in self._daemons:
                if proc.poll() is not None:
                    raise SlurmUnavailable(
                        f"{name} exited ({proc.returncode}) waiting for {what}; see {self.dir / log}"
                    )
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"no {what} within {_READY_TIMEOUT} s; see {self.dir / log}")
            time.sleep(0.1)  # Slurm tells no one when a node registers: its state is polled

    def command(self, argv: Sequence[str]) -> list[str]:
        """A Slurm command (sinfo, srun, sbatch, scontrol...) wrapped to run where it reaches slurmctld
        and where the nodes reach it back (srun's I/O): the switch's network namespace."""
        return self.hosts.switch_command(argv)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """subprocess.run of a Slurm command against this cluster (``SLURM_CONF`` set)."""
        return subprocess.run(self.command(argv), env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it ("idle", "down*", "alloc"...); {} while slurmctld is not
        answering."""
        done = self.run(
            ["sinfo", "--noheader", "--Node", "--format=%N %t"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            return {}
        return dict(line.split() for line in done.stdout.splitlines())

    def daemon_pids(self) -> dict[str, int]:
        """Each running daemon's name and root-namespace PID."""
        return {name: pid for name, proc, pid in self._daemons if proc.poll() is None}

    def strays(self, grace_s: float = 0.0) -> dict[int, str]:
        """Every process but the daemons (and slurmctld's slurmscriptd) that runs against this cluster
        (``SLURM_CONF`` names its configuration: an srun, an salloc, a coordinator, a role), by
        root-namespace PID, with its command line; waits up to ``grace_s`` for them to end."""
        deadline = time.monotonic() + grace_s
        mark = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        daemons = {pid for _, _, pid in self._all} | {proc.pid for _, proc, _ in self._all}
        controller = {pid for name, _, pid in self._all if name == "slurmctld"}  # and its slurmscriptd
        while True:
            found = {}
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) in daemons:
                    continue
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if parent not in controller and mark in (entry / "environ").read_bytes().split(b"\0"):
                        found[int(entry.name)] = (
                            (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                        )
                except OSError:
                    continue  # gone meanwhile, or not ours to read
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """What this cluster still has on the machine, described; [] once ``close`` has done its work."""
        found = [f"{name} {pid}" for name, _, pid in self._all if running(pid)]
        return found + ([f"directory {self.dir}"] if self.dir.exists() else [])

    def close(self) -> None:
        """Kill what still runs against the cluster (``strays``), stop every daemon by its PID (slurmds first,
        munged last), then remove the cluster's files."""
        if hasattr(self, "env"):
            for pid in self.strays():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for _, proc, pid in reversed(self._daemons):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    proc.wait(timeout=_STOP_TIMEOUT)
        self._daemons.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""bench/chaos_hosts.py's faults and what it reads of a run: the plan, the injector that strikes hosts as the
job goes, and the run's events as its coordinator wrote them.

The injector runs in the bench's own process, beside the job: it follows the coordinator's events file
(``RunLog``: one JSON object a line, each with its monotonic time, ``t``), finds each role's host in the
role's ready file (a replacement rewrites it), and strikes through the testbed (``EmulatedHosts.kill``,
``cut``, ``restore``, ``set_rate``). Slurm's view of a struck node (not responding, down) and, after a
partition, the steps and role processes left on the node, are watched from threads of its own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import parse_rate
from testbed.slurm import SlurmCluster

__all__ = ["PLAN", "SMOKE_PLAN", "HostFault", "Injector", "RunLog", "Struck", "steps_for"]

FIRST_STEP = 3  # steps before the first fault: the roles' caches and connections warm
GAP_STEPS = 3  # steps between a fault's recovery (or a partition's restore) and the next fault
SLOW_STEPS = 6  # steps with the slow link
SLOW_DIVISOR = 20  # the slow link's rate: the others' over this
PARTITION_S = 30.0
RECOVERY_WAIT_S = 180.0  # a fault's recovery: detection, replacement, configuration
CLEANUP_WAIT_S = 90.0  # after a restore: Slurm ends the old steps when the node's slurmd registers again
POLL_S = 0.5  # Slurm and the events file tell no one when they change: both are polled


@dataclass(frozen=True)
class HostFault:
    what: str  # "slow_link", "host_loss" or "partition"
    role: str  # the role whose host is struck (for MemoryX: the process that serves the shard then)


PLAN = (
    HostFault("slow_link", "worker-1"),
    HostFault("host_loss", "worker-1"),
    HostFault("partition", "worker-0"),
    HostFault("host_loss", "memoryx-0"),
    HostFault("partition", "memoryx-1"),
    HostFault("host_loss", "swarmx-0"),
)
SMOKE_PLAN = (
    HostFault("slow_link", "worker-1"),
    HostFault("partition", "worker-0"),
    HostFault("host_loss", "memoryx-0"),
)
# the job time each fault needs, in seconds of steps besides its own: a host loss stalls the job rather
# than using steps; a partition's 30 s run on once its roles are replaced (the restore must come before the
# end); after the last fault, its recovery and the cleanup after the partition before it
FAULT_S = {"slow_link": 0.0, "host_loss": 10.0, "partition": PARTITION_S}
SLOW_STEP_FACTOR = 4  # a step with the slow link takes up to this many normal ones
TAIL_S = 40.0
MARGIN = 1.3


def steps_for(plan: tuple[HostFault, ...], step_s: float) -> int:
    """How many steps a job of ``step_s`` seconds a step needs for ``plan`` to be injected whole, each
    fault once the previous has been recovered from, with the job still running when the last is."""
    steps = FIRST_STEP + GAP_STEPS * len(plan)
    steps += sum(SLOW_STEPS * SLOW_STEP_FACTOR for f in plan if f.what == "slow_link")
    seconds = sum(FAULT_S[f.what] for f in plan) + TAIL_S
    return int(MARGIN * (steps + seconds / step_s)) + 1


class RunLog:
    """A run's events as its coordinator appends them to ``path``, followed from a thread until ``close``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="run-log", daemon=True)
        self._thread.start()

    def _read(self, offset: int) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return offset
        complete = data[: data.rfind(b"\n") + 1]
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        if new:
            with self._cond:
                self.events.extend(new)
                self._cond.notify_all()
        return offset + len(complete)

    def _follow(self) -> None:
        offset = 0
        while not self._closed.wait(0.1):
            offset = self._read(offset)
        self._read(offset)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["event"] == kind]

    def count(self, kind: str) -> int:
        return len(self.of(kind))

    @property
    def step(self) -> int:
        steps = self.of("step")
        return steps[-1]["step"] if steps else 0

    def wait(self, ready: Callable[[], bool], ended: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``ready()`` came true within ``timeout_s`` before the run ``ended()``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not ready():
                if ended() or time.monotonic() > deadline:
                    return ready()
                self._cond.wait(POLL_S)
        return True

    def first_after(self, kind: str, t: float) -> dict[str, Any] | None:
        return next((e for e in self.of(kind) if e["t"] >= t), None)

    def first_restart(self, roles: list[str], t: float) -> float | None:
        found = [e["t"] for e in self.of("restart") if e["t"] >= t and e["role"] in roles]
        return min(found) if found else None

    def replay_after(self, t: float) -> int | None:
        e = self.first_after("recovered", t)
        return None if e is None else int(e["replay_steps"])

    def step_times(self) -> list[float]:
        return [e["t"] for e in self.of("step")]

    def step_durations(self) -> list[float]:
        return [e["step_time_s"] for e in self.of("step")]

    def ratios(self, worker: int, after: int, until: int) -> list[float]:
        """The slowest worker's ratio of each step in (``after``, ``until``]; the ratio is worker
        ``worker``'s over the others' median, and 0 where another worker was the slowest."""
        steps = [e for e in self.of("step") if after < e["step"] <= until]
        return [e["slowest_worker_ratio"] if e["slowest_worker"] == worker else 0.0 for e in steps]

    def stragglers(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k not in ("t", "event")} for e in self.of("straggler")]

    def final_checkpoint(self) -> Path | None:
        found = self.of("checkpoint")
        return Path(found[-1]["path"]) if found else None

    def final_step(self) -> int:
        return self.step

    def wall_s(self) -> float:
        with self._cond:
            return self.events[-1]["t"] - self.events[0]["t"] if self.events else 0.0


@dataclass
class Struck:
    """One fault as injected, and what was seen of it."""

    what: str
    role: str
    host: str
    roles: list[str]  # every role on the host when it was struck
    after_step: int
    at: float  # monotonic
    worker_index: int = -1  # slow_link: the index of the worker on the slow host
    until_step: int = 0  # slow_link: the last step with the slow link
    cut_s: float = 0.0  # partition: how long the link was down
    slurm_not_responding_s: float | None = None
    slurm_down_s: float | None = None
    replaced_on: dict[str, str] = field(default_factory=dict)
    old_steps_left: int | None = None  # partition: the job's steps still listed on the node at the end
    old_steps_gone_s: float | None = None  # partition: from the restore until none was listed
    old_processes_left: int | None = None  # partition: role processes still on the host at the end


class Injector:
    """Strikes ``plan``, one fault after another, into the run that ``log`` follows."""

    def __init__(
        self, slurm: SlurmCluster, log: RunLog, run_dir: Path, plan: tuple[HostFault, ...], link_rate: str
    ) -> None:
        self.slurm, self.hosts, self.log, self.run_dir = slurm, slurm.hosts, log, run_dir
        self.plan, self.link_rate = plan, link_rate
        self.slow_divisor = SLOW_DIVISOR
        self.done: list[Struck] = []
        self._watchers: list[threading.Thread] = []

    # -- where the roles are -----------------------------------------------------------------------------
    def _ready(self) -> dict[str, dict[str, Any]]:
        out = {}
        for f in self.run_dir.glob("*.ready.json"):
            try:
                out[f.name.removesuffix(".ready.json")] = json.loads(f.read_text())
            except (OSError, ValueError):  # being rewritten by a replacement
                continue
        return out

    def host_of(self, role: str) -> str:
        """The host of the process that serves ``role`` now (a failover swaps a shard's two processes)."""
        ready = self._ready()
        kind, index = role.rsplit("-", 1)
        changes = [e for e in (self.log.of("status") + self.log.of("recovered")) if "addresses" in e]
        if kind in ("memoryx", "memoryx-replica") and changes:
            address = max(changes, key=lambda e: e["t"])["addresses"][kind][int(index)]
            for info in ready.values():
                if info["address"] == address:
                    return str(info["host"])
        return str(ready[role]["host"])

    def roles_on(self, host: str) -> list[str]:
        return sorted(role for role, info in self._ready().items() if info["host"] == host)

    # -- the faults --------------------------------------------------------------------------------------
    def run(self, ended: Callable[[], bool]) -> None:
        """Inject the plan as the run goes; returns once it is done (or the run has ended)."""
        next_at = FIRST_STEP

        def reached() -> bool:
            return self.log.step >= next_at

        for fault in self.plan:
            if not self.log.wait(reached, ended, RECOVERY_WAIT_S * 4):
                return
            struck = getattr(self, f"_{fault.what}")(fault, ended)
            self.done.append(struck)
            next_at = self.log.step + GAP_STEPS
        for watcher in self._watchers:
            watcher.join(timeout=CLEANUP_WAIT_S + 30)

    def _struck(self, fault: HostFault) -> Struck:
        host = self.host_of(fault.role)
        return Struck(fault.what, fault.role, host, self.roles_on(host), self.log.step, time.monotonic())

    def _slow_link(self, fault: HostFault, ended: Callable[[], bool]) -> Struck:
        struck = self._struck(fault)
        struck.worker_index = int(fault.role.rsplit("-", 1)[1])
        rate = f"{parse_rate(self.link_rate) // self.slow_divisor // 1000}kbit"
        self.hosts.set_rate(struck.host, rate)
        try:
            self.log.wait(lambda: self.log.step >= struck.after_step + SLOW_STEPS, ended, RECOVERY_WAIT_S * 2)
        finally:
            self.hosts.set_rate(struck.host, self.link_rate)
        struck.until_step = self.log.step
        return struck

    def _host_loss(self, fault: HostFault, ended: Callable[[], bool]) -> Struck:
        struck = self._struck(fault)
        self._watch_slurm(struck)
        struck.at = time.monotonic()
        self.hosts.kill(struck.host)
        self._recovered(struck, ended)
        return struck

    def _partition(self, fault: HostFault, ended: Callable[[], bool]) -> Struck:
        struck = self._struck(fault)
        self._watch_slurm(struck)
        struck.at = time.monotonic()
        self.hosts.cut(struck.host)
        try:
            self._recovered(struck, ended)
            left = struck.at + PARTITION_S - time.monotonic()
            if left > 0:
                time.sleep(left)  # the partition lasts this long whatever the job does meanwhile
        finally:
            self.hosts.restore(struck.host)
            struck.cut_s = time.monotonic() - struck.at
        self._watch_cleanup(struck, ended)
        return struck

    def _recovered(self, struck: Struck, ended: Callable[[], bool]) -> None:
        """Wait for the recovery from ``struck`` (a recovered event after it, with every role of the host
        replaced), then note where each of its roles went."""
        restarted = lambda: {e["role"] for e in self.log.of("restart") if e["t"] >= struck.at}  # noqa: E731
        self.log.wait(
            lambda: bool(self.log.first_after("recovered", struck.at)) and set(struck.roles) <= restarted(),
            ended,
            RECOVERY_WAIT_S,
        )
        ready = self._ready()
        struck.replaced_on = {r: str(ready[r]["host"]) for r in struck.roles if r in ready}

    # -- what Slurm and the host show --------------------------------------------------------------------
    def _watch(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self._watchers.append(thread)
        thread.start()

    def _watch_slurm(self, struck: Struck) -> None:
        """Note when Slurm first shows ``struck``'s node not responding ("*") and down."""

        def watch() -> None:
            deadline = time.monotonic() + RECOVERY_WAIT_S
            while time.monotonic() < deadline:
                state = self.slurm.node_states().get(struck.host, "")
                now = time.monotonic() - struck.at
                lost = state.endswith("*") or state.startswith("down")
                if lost and struck.slurm_not_responding_s is None:
                    struck.slurm_not_responding_s = now
                if state.startswith("down"):
                    struck.slurm_down_s = now
                    return
                time.sleep(POLL_S)

        self._watch(watch)

    def _job_steps_on(self, host: str) -> list[str]:
        done = self.slurm.run(["squeue", "--steps", "--noheader", "--format=%i %j %N"], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        rows = [line.split() for line in done.stdout.splitlines()]
        return [r[0] for r in rows if len(r) == 3 and r[2] == host and r[1].startswith("weightstream.")]

    def _role_processes_on(self, host: str) -> int:
        count = 0
        for pid in self.hosts[host].processes():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            count += b"weightstream.cli" in cmdline
        return count

    def _watch_cleanup(self, struck: Struck, ended: Callable[[], bool]) -> None:
        """After a restore: until the node lists none of the job's steps and runs no role, at most
        ``CLEANUP_WAIT_S`` (or until the run ends, which ends every step it has)."""
        restored = time.monotonic()

        def watch() -> None:
            while True:
                steps, procs = self._job_steps_on(struck.host), self._role_processes_on(struck.host)
                struck.old_steps_left, struck.old_processes_left = len(steps), procs
                if not steps and not procs:
                    struck.old_steps_gone_s = time.monotonic() - restored
                    return
                if ended() or time.monotonic() - restored > CLEANUP_WAIT_S:
                    return
                time.sleep(1.0)

        self._watch(watch)

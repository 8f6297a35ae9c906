"""The Slurm backend: each role of a job as a step of one Slurm job, on the node its placement names.

Inside an allocation (``SLURM_JOB_ID`` set: ``salloc``, ``sbatch``) the job's roles run on that
allocation's nodes, which stay the user's. Outside one the backend allocates the nodes its placement
chose with an ``salloc`` that holds them while this process lives (``commands.allocate``), and gives
them back when the roles stop, or when this process dies, however it dies.

Each role is one ``srun`` child of the coordinator: it listens on its node's address (NodeAddr), writes
``<run_dir>/<role>.ready.json`` and ``<run_dir>/<role>.log`` on the shared ``model_dir``, and reads the job's
role credential from its standard input, which srun forwards from a pipe: the token is on no command
line, in no environment srun propagates, in no file and in nothing Slurm records (``scontrol show job``).
A role's end is its srun's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from weightstream.backends.base import BackendError, RoleSpec, ready_file, role_command, wait_ready_files
from weightstream.backends.environment import role_env, without_secrets
from weightstream.backends.slurm import commands as slurm
from weightstream.backends.slurm.capacity import nodes_for, refuse_unplaced
from weightstream.backends.slurm.commands import close_lifeline, describe_srun_exit
from weightstream.backends.slurm.orphans import OrphanSteps
from weightstream.backends.slurm.placement import (
    Node,
    Placement,
    PlacementError,
    PlacementRules,
    place,
)
from weightstream.backends.slurm.reach import end_sruns
from weightstream.backends.slurm.shared_dir import check_shared_dir

__all__ = ["SlurmBackend"]

ALLOCATE_WAIT_S = 60  # seconds a new allocation may wait in the queue before the job fails
# seconds a replaced role's step may take to end once cancelled, its node answering: Slurm ends it, and its
# srun, within about a second (3 s: a loaded node); one that does not is on a node Slurm cannot reach
RESTART_GRACE_S = 3.0


class SlurmBackend:
    co_located = False  # roles on several nodes: tensors travel over the network, never shared memory

    def __init__(
        self,
        run_dir: Path,
        job_name: str = "weightstream",
        rules: PlacementRules | None = None,
        environ: Mapping[str, str] | None = None,
        allocate_wait_s: int = ALLOCATE_WAIT_S,
        nice: int = 0,
    ) -> None:
        """``run_dir``: ``model_dir/logs``, on a filesystem every node sees. ``environ``: this process's
        environment by default; ``SLURM_JOB_ID`` in it means: run inside that allocation. ``nice``: the
        ``salloc --nice`` of an allocation this backend makes (0: Slurm's default priority)."""
        self.run_dir, self.job_name, self.nice = run_dir, job_name, nice
        self.rules, self.allocate_wait_s = rules or PlacementRules(), allocate_wait_s
        self.environ = dict(os.environ if environ is None else environ)
        self.given_job = self.environ.get("SLURM_JOB_ID")
        self.job_id: str | None = None  # the Slurm job the roles run in
        self.placement: Placement | None = None
        self.procs: dict[RoleSpec, subprocess.Popen[bytes]] = {}
        # the salloc holding the allocation this backend made (None inside the caller's allocation)
        self._holder: subprocess.Popen[str] | None = None
        self.nodes: dict[RoleSpec, Node] = {}
        self._spare: list[Node] = []  # the allocation's nodes, for a role whose node is gone
        self._credential = ""
        self._stopping = False
        self._lock = threading.Lock()
        self._tag = secrets.token_hex(4)  # names this run's steps among others of the same allocation
        self._starts = 0  # role starts so far: each step's name ends with its start's number
        self._steps: dict[RoleSpec, str] = {}  # each role's current step, by name
        self._log_from: dict[RoleSpec, int] = {}  # where each role's current step's output starts in its log
        self._rules = self.rules  # with the partition filled in, once placed (``_plan``)
        self._unreachable: set[str] = set()  # nodes that did not answer when their roles were ended
        self._orphans = OrphanSteps(self._listed_steps, self._job_nodes, self._kill_steps)

    # -- where -------------------------------------------------------------------------------------------
    def _where(self) -> str:
        return f" (Slurm job {self.job_id})" if self.job_id else ""

    def _plan(self, roles: list[RoleSpec]) -> tuple[Placement, str | None]:
        """Where each role runs, and the partition a new allocation asks for (None inside one)."""
        counts: dict[str, int] = {}
        for role in roles:
            counts[role.kind] = counts.get(role.kind, 0) + 1
        states, default = slurm.query_nodes(self.environ)
        known = {s.node.name: s for s in states}
        for rule in (self.rules.workers, self.rules.servers):
            if rule.partition and not any(rule.partition in s.node.partitions for s in states):
                partitions = sorted({p for s in states for p in s.node.partitions})
                raise BackendError(
                    f"Slurm has no partition {rule.partition!r}; its partitions: {', '.join(partitions)}"
                )
            missing = [f for f in rule.features if not any(f in s.node.features for s in states)]
            if missing:
                raise BackendError(f"no Slurm node has the feature {', '.join(missing)}")
        if self.given_job:
            live = slurm.live_job(self.given_job, self.environ)
            if live is None or live[0] != "RUNNING":
                raise BackendError(f"SLURM_JOB_ID={self.given_job} names no running Slurm job")
            names = slurm.job_nodes(self.given_job, self.environ)
            candidates, partition = [known[n].node for n in names if n in known], live[1]
            self.job_id = self.given_job
        else:
            candidates, partition = [s.node for s in states if s.idle], None
        try:
            rules = self.rules.in_partition(default, partition, self.given_job)
            placement = place(counts, candidates, rules)
        except ValueError as e:
            scope = f"allocation {self.given_job}" if self.given_job else "idle nodes"
            raise BackendError(f"the Slurm cluster cannot hold the job ({scope}): {e}") from e
        used = {rules.workers.partition, rules.servers.partition}
        if len(used) > 1 and not self.given_job:
            raise BackendError(
                f"workers in partition {rules.workers.partition} and servers in {rules.servers.partition}: "
                "one Slurm job spans one partition; give both the same partition, or tell them apart by "
                "node features"
            )
        self._spare, self._rules = candidates, rules
        return placement, None if self.given_job else rules.workers.partition

    # -- the Backend protocol ------------------------------------------------------------------------------
    def start(self, roles: list[RoleSpec], credential: str) -> None:
        """Place the roles, allocate their nodes (outside an allocation), check that every node writes to
        ``run_dir``, and start each role as an srun step. Raises BackendError naming the cause (and the
        Slurm job, once there is one)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._credential = credential
        placement, partition = self._plan(roles)
        self.placement = placement
        with self._lock:
            if self._stopping:
                return
        if self.job_id is None:
            nodes, wait_s = placement.node_names(), self.allocate_wait_s
            self._holder, self.job_id = slurm.allocate(
                nodes, partition, self.job_name, wait_s, self.environ, self.nice
            )
            with self._lock:
                stopping = self._stopping
            if stopping:  # stopped while salloc waited: the job it got must not stay
                self._release(self.job_id)
                return
        self._probe(placement.node_names())
        self._write_placement(placement)
        for role in roles:
            if not self._spawn(role, placement.nodes[role.name]):
                return

    def _probe(self, nodes: list[str]) -> None:
        """``model_dir`` is on a filesystem every one of ``nodes`` shares, or the job fails here, before any
        role starts (``shared_dir``)."""
        assert self.job_id is not None
        tag = secrets.token_hex(4)
        argv = slurm.probe_command(self.job_id, nodes, str(self.run_dir.resolve()), tag)
        check_shared_dir(argv, self.run_dir, nodes, tag, self.environ, self._where())

    def _write_placement(self, placement: Placement) -> None:
        record = {"slurm_job": self.job_id, "roles": {r: n.name for r, n in placement.nodes.items()}}
        (self.run_dir / "placement.json").write_text(json.dumps(record, indent=1) + "\n")

    def _ready_file(self, role: RoleSpec) -> Path:
        return ready_file(self.run_dir, role)

    def _step_name(self, role: RoleSpec) -> str:
        """A new name for each start of ``role``: a replaced role's step may still be listed (its node out
        of reach) beside its replacement's, and each must be told apart."""
        self._starts += 1
        return f"{self.job_name}.{self._tag}.{role.name}.{self._starts}"

    def _env(self, role: RoleSpec, node: Node) -> dict[str, str]:
        """What srun propagates to the role: this process's environment less its secrets, and the role's
        threads: a worker gets its node's CPUs (its node is its own)."""
        placed = self.placement.nodes.items() if self.placement else ()
        workers_here = sum(1 for r, n in placed if r.startswith("worker-") and n.name == node.name)
        worker_cores = node.cpus // max(1, workers_here)
        return {**without_secrets(self.environ), **role_env(role.kind, worker_cores)}

    def _spawn(self, role: RoleSpec, node: Node) -> bool:
        """Start ``role`` on ``node`` (False: the backend is stopping, nothing was started)."""
        assert self.job_id is not None
        self._ready_file(role).unlink(missing_ok=True)
        log = self.run_dir / f"{role.name}.log"
        # srun forwards this process's pipe as the role's standard input: the role ends when it closes
        cmd = role_command(role, node.address, self._ready_file(role).resolve(), "--until-stdin-closes")
        with self._lock, open(log, "ab") as srun_log:
            if self._stopping:
                return False
            self._steps[role] = step = self._step_name(role)
            self._log_from[role] = srun_log.tell()  # appended to: the predecessor's words come first
            argv = slurm.srun_command(self.job_id, node.name, step, str(log.resolve()), cmd)
            self.nodes[role] = node
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=srun_log,
                stderr=subprocess.STDOUT,  # srun's own words ("task 0: Killed") follow the role's
                start_new_session=True,
                env=self._env(role, node),
            )
            self.procs[role] = proc
        assert proc.stdin is not None
        try:  # the credential, then the pipe stays open: it closes when the step ends or this process dies
            proc.stdin.write(self._credential.encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:  # srun failed at once: dead() reports it with its log
            pass
        return True

    def wait_ready(self, timeout_s: float) -> dict[str, list[str]]:
        roles = list(self.procs)  # a copy: restart() may replace them meanwhile
        return wait_ready_files(
            self.run_dir,
            roles,
            timeout_s,
            lambda: self._stopping,
            self.failures,
            where=self._where,
            named=lambda r: f"{r.name} on {self.nodes[r].name}",
        )

    def dead(self) -> dict[RoleSpec, str]:
        if self._stopping:
            return {}
        out = {}
        with self._lock:
            procs = list(self.procs.items())
        for role, p in procs:
            rc = p.poll()
            if rc is not None:
                log = self.run_dir / f"{role.name}.log"
                where = self.nodes[role].name
                said = self._said_since_start(role, log) if rc == 0 else ""
                out[role] = f"{role.name} on node {where} {describe_srun_exit(rc, said)}; its log: {log}"
        return out

    def _said_since_start(self, role: RoleSpec, log: Path) -> str:
        """What ``role``'s log holds since its current step started: its srun's last words among them."""
        try:
            with open(log, "rb") as f:
                f.seek(self._log_from.get(role, 0))
                return f.read()[-4096:].decode(errors="replace")
        except OSError:
            return ""

    def failures(self) -> list[str]:
        return list(self.dead().values())

    def keep_standby(self, per_kind: int) -> None:
        """Keeps no spare step (not implemented here): ``restart`` starts a lost role afresh as a new
        step; a spare step would hold CPUs and memory of the allocation's nodes the whole job long."""

    def restart(self, roles: list[RoleSpec]) -> None:
        """Kill each of ``roles`` that still runs (its step, SIGKILL: it may be hung) and start it again: on
        its node while that node serves, else where ``placement.replacement`` says; a worker left with no
        node of its own is not started (``capacity``: NoCapacityError). A role whose node does
        not answer at its address (``reach``), or whose step has not ended ``RESTART_GRACE_S`` after its
        cancel, is on a node that is dead or cut off, which Slurm may not have seen yet: its srun is killed
        here rather than waited for, the node is used for no replacement from then on, and the step is
        cancelled again until it is gone (``orphans``)."""
        assert self.job_id is not None
        steps = slurm.job_steps(self.job_id, self.environ)
        live = {r: steps[self._steps[r]] for r in roles if self._steps.get(r) in steps}
        slurm.cancel(list(live.values()), "KILL", self.environ)
        with self._lock:
            olds = {r: p for r in roles if (p := self.procs.get(r)) is not None}
        stuck = end_sruns(olds, {r: self._address(r) for r in olds}, RESTART_GRACE_S)
        for role, old in olds.items():
            close_lifeline(old)
            if role in stuck and role in live:  # cancelled again until gone: the node may come back
                self._orphans.add(live[role], self.nodes[role].name)
        unreachable = {self.nodes[r].name for r in stuck}
        self._unreachable |= unreachable
        serving = self._serving_nodes()
        nodes = [n for n in self._spare if n.name in serving]
        with self._lock:
            running = {r.name: n for r, n in self.nodes.items() if r in self.procs}
        placed = {r.name: n for r, n in self.nodes.items()}
        try:
            chosen, unplaced = nodes_for(
                roles, placed, nodes, (self._unreachable, unreachable), self._rules, running
            )
        except PlacementError as e:
            names = ", ".join(r.name for r in roles)
            raise BackendError(f"no node of the job can take {names}: {e}{self._where()}") from e
        for role in roles:
            if role not in unplaced and not self._spawn(role, chosen[role.name]):
                return
        refuse_unplaced(unplaced, self.job_id)

    def retire(self, roles: list[RoleSpec]) -> None:
        """Forget ``roles``: cancel their steps and end their sruns; ``restart`` starts one again."""
        assert self.job_id is not None
        with self._lock:
            gone = [self.procs.pop(r) for r in roles if r in self.procs]
        steps = slurm.job_steps(self.job_id, self.environ)
        slurm.cancel(
            [steps[n] for r in roles if (n := self._steps.get(r, "")) in steps], "KILL", self.environ
        )
        for srun in gone:
            with contextlib.suppress(subprocess.TimeoutExpired):
                srun.wait(timeout=30)
            srun.kill()  # were it still there (a no-op once it has ended)
            srun.wait(timeout=5)
            close_lifeline(srun)

    def _address(self, role: RoleSpec) -> str | None:
        """The address ``role``'s current process listened on (None: it never said)."""
        try:
            return str(json.loads(self._ready_file(role).read_text())["address"])
        except (OSError, ValueError, KeyError):
            return None

    def _listed_steps(self) -> list[str]:
        assert self.job_id is not None
        return list(slurm.job_steps(self.job_id, self.environ).values())

    def _job_nodes(self) -> list[str]:
        assert self.job_id is not None
        return slurm.job_nodes(self.job_id, self.environ)

    def _kill_steps(self, ids: list[str]) -> None:
        slurm.cancel(ids, "KILL", self.environ)

    def _serving_nodes(self) -> set[str]:
        """The allocation's nodes that are up (neither down nor drained, and still in the job)."""
        assert self.job_id is not None
        states, _ = slurm.query_nodes(self.environ)
        in_job = set(slurm.job_nodes(self.job_id, self.environ))
        return {s.node.name for s in states if s.usable and s.node.name in in_job}

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM every role's step (roles stop in order), SIGKILL what is left after ``grace_s``, and
        cancel the job when this backend allocated it; returns once Slurm lists none of it."""
        with self._lock:
            self._stopping = True
            procs = list(self.procs.values())
        self._orphans.close()  # every step of this run is cancelled below
        job = self.job_id
        if job is None:
            return
        try:
            slurm.try_cancel(self._our_steps(job), "TERM", self.environ)
            deadline = time.monotonic() + grace_s
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
            slurm.try_cancel(self._our_steps(job), "KILL", self.environ)
            if self.given_job is None:
                self._release(job)
        finally:
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)
                close_lifeline(p)

    def _release(self, job: str) -> None:
        """End the allocation this backend made, and wait until Slurm no longer lists it."""
        with self._lock:  # stop() may run on two threads at once: a cancel, and the run winding down
            holder, self._holder = self._holder, None
        if holder is not None:
            slurm.release(holder)
        slurm.cancel([job], env=self.environ)  # were salloc to have left it (salloc killed, say)
        self._wait_gone(job)

    def end_leftovers(self) -> list[str]:
        """End every Slurm job named ``job_name`` (a killed coordinator's leftovers); their ids."""
        found = slurm.jobs_named(self.job_name, self.environ)
        slurm.cancel(found, env=self.environ)
        for job in found:
            self._wait_gone(job)
        return found

    def _our_steps(self, job: str) -> list[str]:
        prefix = f"{self.job_name}.{self._tag}."
        return [step for name, step in slurm.job_steps(job, self.environ).items() if name.startswith(prefix)]

    def _wait_gone(self, job: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while slurm.live_job(job, self.environ) is not None:
            if time.monotonic() > deadline:
                raise BackendError(f"Slurm job {job} still listed {timeout_s:.0f} s after it was cancelled")
            time.sleep(0.2)  # Slurm tells no one when a job has ended: squeue is polled

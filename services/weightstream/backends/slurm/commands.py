"""Slurm's commands (sinfo, squeue, scontrol, salloc, srun, scancel), run and read: the one place where
weightstream talks to Slurm. No library: ``pyslurm`` follows libslurm's versions, the commands are what
every Slurm site has, and they read ``SLURM_CONF`` and the user's munge credentials as a user's would.

Parsing lives in pure functions (``parse_nodes``, ``granted_job``...) that tests feed with Slurm's own
output.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from weightstream.backends.base import BackendError
from weightstream.backends.slurm.placement import Node

__all__ = [
    "NodeState",
    "SlurmError",
    "allocate",
    "cancel",
    "close_lifeline",
    "describe_srun_exit",
    "granted_job",
    "job_nodes",
    "job_steps",
    "jobs_named",
    "live_job",
    "parse_nodes",
    "probe_command",
    "query_nodes",
    "release",
    "srun_command",
    "try_cancel",
]

log = logging.getLogger("weightstream.backends.slurm")

COMMAND_TIMEOUT_S = 60.0  # one Slurm command; slurmctld answers in milliseconds, or MessageTimeout says not
_SINFO_FORMAT = "%N|%P|%f|%t|%c|%o"  # name, partition (default marked *), features, state, CPUs, NodeAddr
# node states that take new jobs (sinfo's short forms; "*" after a state: not responding)
_USABLE = {"idle", "mix", "alloc"}


class SlurmError(BackendError):
    """A Slurm command failed or could not reach slurmctld; the message holds what the command said."""


@dataclass(frozen=True)
class NodeState:
    node: Node
    state: str  # sinfo's short state: idle, mix, alloc, down*, drain...

    @property
    def idle(self) -> bool:
        return self.state == "idle"

    @property
    def usable(self) -> bool:
        return self.state in _USABLE


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run a Slurm command; its standard output, or SlurmError with its error output."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except FileNotFoundError as e:
        raise SlurmError(f"{argv[0]} is not installed here: the Slurm backend runs Slurm's commands") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f} s: is slurmctld up?") from e
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise SlurmError(f"{argv[0]}: {said}")
    return done.stdout


def parse_nodes(text: str) -> tuple[list[NodeState], str | None]:
    """sinfo ``--Node --format=%N|%P|%f|%t|%c|%o`` output as nodes (a node in several partitions once, with
    all of them) and the default partition (None if the cluster has none)."""
    partitions: dict[str, set[str]] = {}
    rows: dict[str, list[str]] = {}
    default = None
    for line in text.splitlines():
        if not line.strip():
            continue
        name, partition, features, state, cpus, addr = line.strip().split("|")
        if partition.endswith("*"):
            partition = default = partition[:-1]
        partitions.setdefault(name, set()).add(partition)
        rows.setdefault(name, [features, state, cpus, addr])
    out = []
    for name, (features, state, cpus, addr) in rows.items():
        feats = frozenset() if features == "(null)" else frozenset(features.split(","))
        cpu_count = int(cpus) if cpus.isdigit() else 1
        node = Node(name, addr, frozenset(partitions[name]), feats, cpu_count)
        out.append(NodeState(node, state))
    return out, default


def query_nodes(env: Mapping[str, str] | None = None) -> tuple[list[NodeState], str | None]:
    """Every node of the cluster and the default partition (``sinfo``)."""
    return parse_nodes(run(["sinfo", "--noheader", "--Node", f"--format={_SINFO_FORMAT}"], env))


def expand_hostlist(hostlist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """A Slurm hostlist ("h[1-3],h5") as names (``scontrol show hostnames``)."""
    return run(["scontrol", "show", "hostnames", hostlist], env).split()


def live_job(job_id: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(state, partition) of job ``job_id`` while Slurm still lists it (pending, running, completing);
    None once it is gone."""
    try:
        out = run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%P"], env).split()
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    if not out:
        return None
    state, partition = out[0].split("|")
    return state, partition


def job_nodes(job_id: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes allocated to job ``job_id`` (an empty list while it is pending)."""
    hostlist = run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%N"], env).strip()
    return expand_hostlist(hostlist, env) if hostlist else []


def job_steps(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each running step of job ``job_id``: its name -> its id ("12.3")."""
    try:
        out = run(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"], env)
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return {}
        raise
    return {name: step for step, name in (line.split(maxsplit=1) for line in out.splitlines() if " " in line)}


def jobs_named(name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The ids of every job Slurm lists (pending, running, completing) named ``name``."""
    return run(["squeue", "--noheader", f"--name={name}", "--format=%i"], env).split()


def granted_job(salloc_stderr: str) -> str | None:
    """The job id salloc names ("Granted job allocation 12", or "Pending job allocation 12" of a job that
    then failed), or None."""
    found = re.search(r"(?:Granted|Pending) job allocation (\d+)", salloc_stderr)
    return found[1] if found else None


def allocate(
    nodes: Sequence[str],
    partition: str | None,
    job_name: str,
    wait_s: int,
    env: Mapping[str, str] | None = None,
    nice: int = 0,
) -> tuple[subprocess.Popen[str], str]:
    """Allocate ``nodes`` whole as one job named ``job_name``: (the salloc that holds it, the job's id).

    salloc runs a command here that waits for its standard input, a pipe from this process, to close:
    closing it (``release``), or this process dying however it dies, ends the command, and salloc then
    gives the allocation back, which ends every step in it. ``--no-kill``: a node that fails takes its
    roles, not the job (the coordinator replaces them). Gives up after ``wait_s`` seconds in the queue
    (``--immediate``); SlurmError then names the job. ``nice`` > 0 lowers the job's priority among
    the jobs waiting for nodes (``--nice``; only an operator may raise it)."""
    argv = [
        "salloc",
        "--exclusive",
        "--no-kill",
        f"--job-name={job_name}",
        f"--nodes={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        f"--immediate={wait_s}",
        *([f"--partition={partition}"] if partition else []),
        *([f"--nice={nice}"] if nice else []),
        "sh",
        "-c",
        "read _",
    ]
    try:
        holder = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # a Ctrl-C reaches the coordinator, which releases the job in order
        )
    except FileNotFoundError as e:
        raise SlurmError("salloc is not installed here: the Slurm backend runs Slurm's commands") from e
    assert holder.stderr is not None
    said: list[str] = []
    # salloc says "Granted job allocation N" once it holds the nodes, or ends (bounded by --immediate)
    for line in holder.stderr:
        said.append(line.strip().removeprefix("salloc: "))
        if line.startswith("salloc: Granted job allocation"):
            job = granted_job(line)
            assert job is not None
            return holder, job
    holder.wait(timeout=COMMAND_TIMEOUT_S)
    job = granted_job("\n".join(f"salloc: {line}" for line in said))
    where = f" (Slurm job {job})" if job else ""
    raise SlurmError(f"salloc could not allocate {', '.join(nodes)}{where}: {' '.join(said)}")


def release(holder: subprocess.Popen[str], timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Give back the allocation ``allocate`` made: its command ends, salloc relinquishes the job."""
    try:
        holder.communicate(timeout=timeout)  # closes salloc's standard input, reads what it says
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.communicate(timeout=timeout)


def cancel(ids: Sequence[str], signal: str | None = None, env: Mapping[str, str] | None = None) -> None:
    """``scancel`` jobs or steps ("12", "12.3"); with ``signal`` (TERM, KILL) only signal them. Ids that
    are already gone are no error."""
    if not ids:
        return
    argv = ["scancel", *([f"--signal={signal}"] if signal else []), *ids]
    try:
        run(argv, env)
    except SlurmError as e:
        if "Invalid job id" not in str(e) and "No error" not in str(e):
            raise


def try_cancel(ids: Sequence[str], signal: str, env: Mapping[str, str] | None = None) -> None:
    """``cancel``, a failure logged rather than raised: a stop goes on to end what it can. scancel fails
    for a step on a node Slurm cannot reach ("Kill job error on job step id 3: Communication connection
    failure"); Slurm ends that step itself once the node is marked down, or comes back."""
    try:
        cancel(ids, signal, env)
    except SlurmError as e:
        log.warning("could not signal every step (%s) with %s: %s", ", ".join(ids), signal, e)


def srun_command(job_id: str, node: str, step_name: str, log: str, argv: Sequence[str]) -> list[str]:
    """``srun`` of ``argv`` as one task on ``node`` in job ``job_id``, as a step named ``step_name`` whose
    output goes to ``log`` (appended: a replacement's output follows its predecessor's). ``--overlap``:
    several roles share a node's CPUs, as processes on one machine do."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",
        f"--job-name={step_name}",
        f"--output={log}",
        "--open-mode=append",
        *argv,
    ]


def probe_command(job_id: str, nodes: Sequence[str], directory: str, tag: str) -> list[str]:
    """``srun`` of one task per node of ``nodes`` that writes ``directory/.probe-<tag>-<node>`` holding its
    node's name: the coordinator then reads each, proving every node writes where it reads."""
    script = 'printf %s "$SLURMD_NODENAME" > "$0/.probe-$1-$SLURMD_NODENAME"'
    return [
        "srun",
        f"--jobid={job_id}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--overlap",
        "--job-name=weightstream-probe",
        "sh",
        "-c",
        script,
        directory,
        tag,
    ]


def describe_srun_exit(rc: int, said: str = "") -> str:
    """A role's end from its srun's exit status: srun exits as its task did, 128 + the signal that
    killed it; a role told to stop by SIGTERM exits 143 in order (``role.serve_role``). ``said``: what srun
    wrote meanwhile; srun exits 0 when Slurm declares the node down under the task ("srun: error: Node
    failure on h3"), as a task that ended by itself would."""
    if rc > 128:
        try:
            name = signal.Signals(rc - 128).name
        except ValueError:
            return f"exited with status {rc}"
        stopped = name in ("SIGTERM", "SIGINT")
        return f"stopped on {name} (exit status {rc})" if stopped else f"was killed by {name}"
    if rc < 0:
        return f"(its srun) was killed by {signal.Signals(-rc).name}"
    failed = re.search(r"srun: error: Node failure on (\S+)", said)
    if rc == 0 and failed:
        return f"was lost with its node (Slurm declared {failed[1]} down: node failure)"
    return f"exited with status {rc}"


def close_lifeline(srun: subprocess.Popen[bytes]) -> None:
    """Close the pipe a role's step reads to learn this process lives (its srun has ended)."""
    if srun.stdin is not None:
        with contextlib.suppress(OSError):
            srun.stdin.close()

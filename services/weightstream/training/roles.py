"""The coordinator's side of the role plane: configure every role, call them all at once, probe them,
watch their heartbeats.

One ``RolePlane`` per run. Each (re)configuration opens fresh channels that carry the current generation
(``transport.fencing``) and closes the previous ones, which cancels whatever calls of the interrupted
attempt were still waiting. The calls of a step go through the typed clients it then makes,
``memoryx`` and ``workers`` (training/clients.py), over those channels; the heartbeats
(training/heartbeats.py) go over its Control channels, one per process.

Roles are slots of the current plan, served by processes the backend started: a MemoryX shard by the process
started as its replica after a failover (``promoted``), worker slot ``i`` by worker process
``workers_at[i]`` (a job that goes on with fewer workers, training/elastic.py, serves its slots with the
processes it has left; the SwarmX processes beyond the smaller plan's tree idle).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, TypeVar

import grpc

from weightstream.backends.base import Backend, BackendError, RoleSpec
from weightstream.plan import REPLICA, ROLE_KINDS, JobSpec, Plan, process_kind
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.training.clients import MemoryXClient, WorkerClient
from weightstream.training.errors import JobFailed, RoleFault
from weightstream.training.heartbeats import Heartbeats, Ping
from weightstream.transport.rpc import call, open_channel

__all__ = ["RolePlane"]

T = TypeVar("T")


def uses_shared_memory(data_plane: str, backend: Backend) -> bool:
    """Whether roles may exchange tensors in shared memory (``runconfig.data_plane``): each pair of roles
    then uses it where both are on one host and can map each other's memfds, the network otherwise
    (transport/peers.py). ``grpc`` keeps every byte on the network; ``shared_memory`` is refused up front
    on a backend that never places two roles on one host."""
    if data_plane == "shared_memory" and not getattr(backend, "co_located", False):
        raise JobFailed(
            "runconfig.data_plane: shared_memory needs every role on one host (the local backend); "
            "use auto or grpc"
        )
    return data_plane != "grpc"


def _health(control: rpc.ControlStub, timeout_s: float) -> None:
    """A heartbeat: Control.Health with a deadline of ``timeout_s``; raises grpc.RpcError unanswered."""
    control.Health(pb.Empty(), timeout=timeout_s)


class RolePlane:
    def __init__(
        self,
        backend: Backend,
        plan: Plan,
        params: dict[str, Any],
        job_id: str,
        credential: str,
        timeout_s: float,
        heartbeat_timeout_s: float = 2.0,
    ) -> None:
        """``plan``: the job's, with every process the backend starts (``runconfig.num_csx`` workers);
        ``timeout_s``: the deadline of every call (``runconfig.rpc_timeout_s``); a role that has not
        answered heartbeats for ``heartbeat_timeout_s`` is hung (``runconfig.heartbeat_timeout_s``)."""
        self.backend, self.plan, self.params, self.job_id = backend, plan, params, job_id
        self.full_plan = plan  # the processes the job has, whatever the current plan
        self.credential, self.timeout_s = credential, timeout_s
        self.heartbeats = Heartbeats(heartbeat_timeout_s)
        self.shared_memory = uses_shared_memory(params["runconfig"].get("data_plane", "auto"), backend)
        # the processes', by kind and process index, as started ("" for a retired worker: ``placed``)
        self.addresses: dict[str, list[str]] = {}
        self.promoted: set[int] = set()  # shards served by the process started as their replica
        self.workers_at = tuple(range(plan.counts()["worker"]))  # the process serving each worker slot
        # worker processes the job goes on without (``Backend.retire``, training/elastic.py)
        self.retired: frozenset[int] = frozenset()
        self._generation = 0
        # the clients of the current configuration (none before the first)
        self.workers = WorkerClient([], self.all, timeout_s)
        self.memoryx = MemoryXClient([], self.all, timeout_s)
        self._channels: list[grpc.Channel] = []
        n = sum(plan.counts().values())
        # room for a new attempt's calls while the previous attempt's are being cancelled
        self._pool = ThreadPoolExecutor(max(8, 3 * n), thread_name_prefix="coord")

    def close(self) -> None:
        self.heartbeats.close()
        for c in self._channels:
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def generation(self) -> int:
        """The configuration attempt every call of this plane carries: 0 for the run's first."""
        return self._generation

    def next_generation(self) -> int:
        """Begin a new configuration attempt (recovery), returned: once ``configure`` has run, every role
        refuses the calls of the attempts before it, wherever they still arrive (``transport.fencing``)."""
        self._generation += 1
        return self._generation

    def _channel(self, address: str) -> grpc.Channel:
        channel = open_channel(address, self.credential, self.generation)
        self._channels.append(channel)
        return channel

    # -- calling every role of a kind ----------------------------------------------------------------------
    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` (calls through this plane) in the background: one step's calls overlapping the
        previous step's (training/stepping.py)."""
        return self._pool.submit(fn)

    def check_roles(self, grace_s: float = 0.0) -> None:
        """Raise RoleFault if a role has died or stopped answering heartbeats (hung). ``grace_s``: after a
        failed call, the peer's exit may reach us a moment after its closed connection does, so look
        again for that long."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = self.backend.failures()
            if dead:
                raise RoleFault("role died: " + "; ".join(dead))
            self._check_heartbeats()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def _check_heartbeats(self, kind: str | None = None) -> None:
        """Raise RoleFault if a role (of ``kind``, or any) has not answered heartbeats for their timeout."""
        hung = self.heartbeats.unresponsive(kind)
        if hung:
            by_name = sorted(hung.items(), key=lambda kv: (kv[0].kind, kv[0].index))  # roles of one host
            raise RoleFault("; ".join(Heartbeats.message(r, s) for r, s in by_name))

    def all(
        self,
        kind: str,
        fn: Callable[[int], T],
        timeout_s: float,
        watch: bool = True,
        count: int | None = None,
    ) -> list[T]:
        """Run ``fn(i)`` for every role of ``kind`` (or ``count`` calls) concurrently. Any failure raises
        RoleFault at once, as does a role of ``kind`` that stops answering heartbeats (the calls wait on
        it) and (with ``watch``) any role of the job dying or hanging meanwhile."""
        n = self.plan.counts()[kind] if count is None else count
        futures: list[Future[T]] = [self._pool.submit(fn, i) for i in range(n)]
        deadline = time.monotonic() + timeout_s
        pending: set[Future[T]] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            for f in done:
                if (e := f.exception()) is not None:
                    if watch:
                        self.check_roles(grace_s=1.0)  # a dead role explains a failed call better
                    raise RoleFault(str(e)) from e
            if watch:
                self.check_roles()
            else:
                self._check_heartbeats(kind)
            if time.monotonic() > deadline:
                raise RoleFault(f"{kind}s did not answer within {timeout_s:.0f}s")
        return [f.result() for f in futures]

    # -- processes and the slots they serve -----------------------------------------------------------------
    def placed(self, found: dict[str, list[str]]) -> dict[str, list[str]]:
        """The backend's addresses (``Backend.wait_ready``: none for a retired worker) by process index, a
        retired worker's "" (``addresses``)."""
        workers, n = found.get("worker", []), self.full_plan.num_csx
        if len(workers) != n - len(self.retired):
            raise BackendError(
                f"the backend gave {len(workers)} worker addresses for {n - len(self.retired)} workers"
            )
        live = iter(workers)
        return {**found, "worker": ["" if i in self.retired else next(live) for i in range(n)]}

    def processes(self) -> list[RoleSpec]:
        """Every process of the job the backend runs (a retired worker's aside), in start order."""
        return [
            RoleSpec(k, i) for k, i in self.full_plan.roles() if not (k == "worker" and i in self.retired)
        ]

    def use_workers(self, plan: Plan, processes: tuple[int, ...]) -> None:
        """From the next ``configure`` on: the job trains with ``plan`` (its other roles the same, its
        workers as many as ``processes``), worker slot ``i`` served by worker process ``processes[i]``."""
        if plan.num_csx != len(processes):
            raise ValueError(f"a plan of {plan.num_csx} workers served by {len(processes)} processes")
        self.plan, self.workers_at = plan, processes

    def serving(self, addresses: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
        """Where each role is served from, by kind and index, as the roles are told (``JobSpec.addresses``):
        the processes' ``addresses`` (as the backend reports them), with each shard in ``promoted`` served by
        the process started as its replica, and that shard's replica by the process started as the shard;
        worker slot ``i`` by worker process ``workers_at[i]``."""
        out = {k: list(v) for k, v in (self.addresses if addresses is None else addresses).items()}
        for i in self.promoted:
            out["memoryx"][i], out[REPLICA][i] = out[REPLICA][i], out["memoryx"][i]
        if "worker" in out:
            out["worker"] = [out["worker"][p] for p in self.workers_at]
        return out

    def serving_process(self, kind: str, index: int) -> RoleSpec:
        """The process (as the backend names it) that serves role ``kind``-``index`` now."""
        if kind in ("memoryx", REPLICA) and index in self.promoted:
            return RoleSpec(REPLICA if kind == "memoryx" else "memoryx", index)
        if kind == "worker":
            return RoleSpec(kind, self.workers_at[index])
        return RoleSpec(kind, index)

    def address_of(self, process: RoleSpec) -> str:
        """Where ``process`` (as the backend names it) listens, as of the last configuration ("": nowhere
        known: retired, or started since)."""
        found = self.addresses.get(process.kind, [])
        return found[process.index] if process.index < len(found) else ""

    # -- configuration -------------------------------------------------------------------------------------
    def configure(
        self,
        addresses: dict[str, list[str]],
        resume_dir: str | None,
        keep_state: bool = False,
        later: frozenset[int] = frozenset(),
    ) -> None:
        """Configure every role for the current generation. ``keep_state``: MemoryX shards (and replicas)
        keep their weights and state (a fault elsewhere); otherwise they load ``resume_dir`` (None: the
        seed's). ``addresses``: the processes' (``serving`` gives who serves what). ``later``: shards whose
        replica is left unconfigured (a new process with no state yet: ``configure_replica``). The
        heartbeats pause meanwhile, and watch every process of the new configuration once it is done."""
        self.heartbeats.pause()
        old, self._channels = self._channels, []
        self.addresses = addresses
        serving = self.serving()
        pings: dict[RoleSpec, Ping] = {}  # by process, as the backend names them
        for kind, processes in addresses.items():
            pings |= {  # a retired worker (training/elastic.py) has no address: nothing to watch
                RoleSpec(kind, i): partial(_health, rpc.ControlStub(self._channel(a)))
                for i, a in enumerate(processes)
                if a
            }
        for kind in ROLE_KINDS:  # MemoryX and activation first: SwarmX and workers only connect lazily anyway
            controls = [rpc.ControlStub(self._channel(a)) for a in serving.get(kind, [])]
            skip = later if kind == REPLICA else frozenset()

            def configure(
                i: int, kind: str = kind, controls: list[Any] = controls, skip: frozenset[int] = skip
            ) -> None:
                if i not in skip:
                    self._configure_one(controls[i], kind, i, serving, resume_dir, keep_state)

            self.all(kind, configure, self.timeout_s)
        self._clients(serving, skip=later)
        for c in old:  # the interrupted attempt's calls still waiting end now (CANCELLED)
            c.close()
        self.heartbeats.watch(pings)
        self.heartbeats.start()

    def configure_replica(self, shard: int, resume_dir: str) -> None:
        """Configure shard ``shard``'s replica, left out by ``configure(later=...)``, from ``resume_dir`` (a
        snapshot of the step every shard is at), in the current generation; from then on it is sent every
        update its shard is."""
        serving = self.serving()
        control = rpc.ControlStub(self._channel(serving[REPLICA][shard]))
        self._configure_one(control, REPLICA, shard, serving, resume_dir, keep_state=False)
        self._clients(serving)

    def _configure_one(
        self,
        control: Any,
        kind: str,
        i: int,
        serving: dict[str, list[str]],
        resume_dir: str | None,
        keep_state: bool,
    ) -> None:
        job = JobSpec(
            self.params,
            self.plan.to_dict(),
            serving,
            process_kind(kind),
            i,
            resume_dir,
            self.job_id,
            generation=self.generation,
            keep_state=keep_state,
            shared_memory=self.shared_memory,
            replica=kind == REPLICA,
        )
        request = pb.ConfigureRequest(job_json=job.to_json())
        call(f"{kind}-{i}", "Configure", control.Configure, request, timeout=self.timeout_s)

    def _clients(self, serving: dict[str, list[str]], skip: frozenset[int] = frozenset()) -> None:
        workers = [rpc.WorkerStub(self._channel(a)) for a in serving["worker"]]
        self.workers = WorkerClient(workers, self.all, self.timeout_s)
        shards = [rpc.MemoryXStub(self._channel(a)) for a in serving["memoryx"]]
        replicas = [
            rpc.MemoryXStub(self._channel(a)) for i, a in enumerate(serving.get(REPLICA, [])) if i not in skip
        ]
        self.memoryx = MemoryXClient(shards, self.all, self.timeout_s, replicas)

    def probe(self, roles: list[RoleSpec], timeout_s: float) -> dict[RoleSpec, pb.HealthReply | None]:
        """Each role's Health reply, or None where it does not answer within ``timeout_s`` (hung)."""

        def health(role: RoleSpec) -> pb.HealthReply | None:
            channel = open_channel(self.address_of(role), self.credential, self.generation)
            try:
                return rpc.ControlStub(channel).Health(pb.Empty(), timeout=timeout_s)
            except grpc.RpcError:
                return None
            finally:
                channel.close()

        return dict(zip(roles, self._pool.map(health, roles), strict=True))

    def refusing(self, roles: list[RoleSpec], timeout_s: float) -> set[RoleSpec]:
        """Those of ``roles`` whose process no longer takes calls: a Health call fails at once (its server
        is closed: it is exiting, or gone), where a stopped or cut-off process lets it time out."""

        def refuses(role: RoleSpec) -> bool:
            channel = open_channel(self.addresses[role.kind][role.index], self.credential, self.generation)
            try:
                rpc.ControlStub(channel).Health(pb.Empty(), timeout=timeout_s)
                return False
            except grpc.RpcError as e:
                return e.code() != grpc.StatusCode.DEADLINE_EXCEEDED
            finally:
                channel.close()

        return {r for r, no in zip(roles, self._pool.map(refuses, roles), strict=True) if no}

    def shard_steps(self, timeout_s: float, but: frozenset[RoleSpec] = frozenset()) -> list[int | None]:
        """How many steps each MemoryX process, shard or replica, has applied (None: it did not answer),
        ``but`` those named."""
        counts = self.plan.counts()
        roles = [RoleSpec(k, i) for k in ("memoryx", REPLICA) for i in range(counts[k])]
        roles = [r for r in roles if r not in but]
        replies = self.probe(roles, timeout_s)
        return [None if (r := replies[role]) is None else int(r.state_step) for role in roles]

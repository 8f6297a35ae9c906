"""The coordinator's job API over gRPC: the same ``JobService`` as REST, translated to gRPC messages.

Jobs are the JSON objects of the REST API (``api.views.JobView``), so both APIs describe a job identically.
The server is ``grpc.aio`` on a thread and event loop of its own: an open ``WatchJob`` is a coroutine
parked on the store's feed, not a thread, and the REST API's loop never waits on gRPC work (or the
reverse). Every store and service call runs in a small thread pool, never on the loop: they are SQLite
and params validation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
import grpc.aio

from weightstream.jobs.api.views import JobView
from weightstream.jobs.notify import follow
from weightstream.jobs.service import CapacityError, JobService, QueueFull
from weightstream.jobs.store import IllegalTransition, Job, JobFinished, UnknownJob, event_json
from weightstream.params import ParamsError
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.rpc import OPTIONS

__all__ = ["STORE_THREADS", "CoordinatorServer", "CoordinatorServicer", "serve_grpc"]

log = logging.getLogger("weightstream.grpc_api")

# Threads for store and service calls. The store serialises on one lock anyway; a few more let a slow
# submission (params validation, reading its data) run beside the quick reads of many watchers.
STORE_THREADS = 8


class CoordinatorServicer(rpc.CoordinatorServicer):
    """Decode, call the service off the loop, encode; map the service's errors to status codes."""

    def __init__(self, service: JobService, token: str) -> None:
        self.service, self.token = service, token.encode()

    async def _authorize(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        if isinstance(given, bytes):  # gRPC gives bytes only for keys ending in -bin, which this is not
            given = ""
        ok = given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), self.token)
        if not ok:
            await _abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "metadata 'authorization: Bearer <token>' is required",
            )

    async def _job(self, job_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        try:
            job = await asyncio.to_thread(self.service.store.get, job_id)
        except UnknownJob as e:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(e))
        view = await asyncio.to_thread(JobView.of, job, self.service.store)
        return view.model_dump_json()

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JobReply:
        await self._authorize(context)
        try:
            params = json.loads(request.params_json)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"params_json is not JSON: {e}")
        if not isinstance(params, dict):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "params_json must be a JSON object")
        # proto3 cannot tell 0 from unset: 0 means "the params' runconfig.num_csx", as an omitted REST field
        num_csx = request.num_csx or None
        submit = functools.partial(
            self.service.submit, params, num_csx, dict(request.labels), request.priority or 2
        )
        try:
            job = await asyncio.to_thread(submit)
        except QueueFull as e:
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except (ParamsError, CapacityError, ValueError) as e:  # ParamsError names every bad key path
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.JobReply(job_json=JobView.of(job).model_dump_json())

    async def GetJob(
        self, request: pb.JobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JobReply:
        await self._authorize(context)
        return pb.JobReply(job_json=await self._job(request.job_id, context))

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListJobsReply:
        await self._authorize(context)
        jobs = await asyncio.to_thread(self.service.store.list, request.status or None, dict(request.labels))
        return pb.ListJobsReply(job_json=[JobView.of(j).model_dump_json() for j in jobs])

    async def CancelJob(
        self, request: pb.JobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JobReply:
        await self._authorize(context)
        await self._job(request.job_id, context)
        try:
            await asyncio.to_thread(self.service.cancel, request.job_id)
        except IllegalTransition as e:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.JobReply(job_json=await self._job(request.job_id, context))

    async def SetJobLabels(
        self, request: pb.SetJobLabelsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JobReply:
        await self._authorize(context)
        change = functools.partial(
            self.service.set_labels, request.job_id, dict(request.set), list(request.remove)
        )
        return pb.JobReply(job_json=await self._change(change, context))

    async def SetJobPriority(
        self, request: pb.SetJobPriorityRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JobReply:
        await self._authorize(context)
        change = functools.partial(self.service.set_priority, request.job_id, request.priority)
        return pb.JobReply(job_json=await self._change(change, context))

    async def _change(self, change: Callable[[], Job], context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """Run a change of a job off the loop; the job as JSON, or the service's refusal as a status."""
        try:
            job = await asyncio.to_thread(change)
        except UnknownJob as e:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(e))
        except JobFinished as e:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ParamsError as e:  # names every bad key
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return JobView.of(job).model_dump_json()

    async def WatchJob(
        self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.JobEvent]:
        """The job's events after ``request.after``, live until it has finished. While nothing happens
        the call waits on the store's feed; a client that goes away cancels it at that wait."""
        await self._authorize(context)
        await self._job(request.job_id, context)  # NOT_FOUND before the stream starts
        store = self.service.store
        read = functools.partial(store.tail, request.job_id)
        async for e in follow(store.feed, request.job_id, read, after=request.after):
            if e is not None:  # no idle_s: gRPC's own keepalive covers quiet streams
                yield pb.JobEvent(seq=e["seq"], kind=e["kind"], data_json=event_json(e))


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str
) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")  # tells type checkers it never returns


class CoordinatorServer:
    """The aio gRPC server, started on its own thread and event loop; ``port`` is the bound port.

    Raises OSError if ``address`` cannot be bound. ``stop(grace)`` lets calls in flight finish for up to
    ``grace`` seconds (open ``WatchJob`` streams are then cancelled) and returns once it has stopped."""

    def __init__(self, servicer: CoordinatorServicer, address: str) -> None:
        self.address = address
        self.port = 0
        self._grace: float | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, args=(servicer,), name="grpc-api", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self, servicer: CoordinatorServicer) -> None:
        try:
            asyncio.run(self._serve(servicer))
        except BaseException as e:
            if self._ready.is_set():  # it had started: nobody is left to raise to
                log.exception("the coordinator's gRPC server failed")
            self._error = e
        finally:
            self._ready.set()

    async def _serve(self, servicer: CoordinatorServicer) -> None:
        loop = asyncio.get_running_loop()
        # asyncio.run shuts this executor down (waiting for calls in it) when _serve returns
        loop.set_default_executor(ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="grpc-api-store"))
        server = grpc.aio.server(options=OPTIONS)
        rpc.add_CoordinatorServicer_to_server(servicer, server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as e:  # grpc's "Failed to bind to address ..."
            raise OSError(
                f"cannot bind the coordinator's gRPC API to {self.address}: the port is taken, or the "
                "host is not an address of this machine"
            ) from e
        await server.start()
        self.port, self._loop, self._stopping = port, loop, asyncio.Event()
        self._ready.set()
        await self._stopping.wait()
        await server.stop(self._grace)

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (see the class); safe to call more than once."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and self._thread.is_alive():
            self._grace = grace
            with contextlib.suppress(RuntimeError):  # the loop has just finished on its own
                loop.call_soon_threadsafe(stopping.set)
        self._thread.join()


def serve_grpc(service: JobService, token: str, address: str) -> tuple[CoordinatorServer, int]:
    """Start the coordinator's gRPC API on ``address`` (port 0 picks a free one); returns the running
    server (``stop(grace)`` it) and its port."""
    server = CoordinatorServer(CoordinatorServicer(service, token), address)
    return server, server.port

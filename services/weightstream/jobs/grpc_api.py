"""The coordinator's job API over gRPC: the same ``JobService`` as REST, translated to gRPC messages.

Jobs are the JSON objects of the REST API (``api.views.JobView``), so both APIs describe a job identically.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Iterator

import grpc

from weightstream.jobs.api.views import JobView
from weightstream.jobs.service import CapacityError, JobService
from weightstream.jobs.store import IllegalTransition, UnknownJob
from weightstream.params import ParamsError
from weightstream.proto import weightstream_pb2 as pb
from weightstream.proto import weightstream_pb2_grpc as rpc
from weightstream.transport.rpc import create_server

__all__ = ["CoordinatorServicer", "serve_grpc"]


class CoordinatorServicer(rpc.CoordinatorServicer):
    def __init__(self, service: JobService, token: str) -> None:
        self.service, self.token = service, token.encode()

    def _authorize(self, context: grpc.ServicerContext) -> None:
        given = dict(context.invocation_metadata()).get("authorization", "")
        ok = given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), self.token)
        if not ok:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "metadata 'authorization: Bearer <token>' is required"
            )

    def _job(self, job_id: str, context: grpc.ServicerContext) -> str:
        try:
            return JobView.of(self.service.store.get(job_id)).model_dump_json()
        except UnknownJob as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            raise

    def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.ServicerContext) -> pb.JobReply:
        self._authorize(context)
        try:
            params = json.loads(request.params_json)
            if not isinstance(params, dict):
                raise ValueError("params_json must be a JSON object")
            job = self.service.submit(params, request.num_csx, dict(request.labels), request.priority or 2)
        except ParamsError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (CapacityError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.JobReply(job_json=JobView.of(job).model_dump_json())

    def GetJob(self, request: pb.JobRequest, context: grpc.ServicerContext) -> pb.JobReply:
        self._authorize(context)
        return pb.JobReply(job_json=self._job(request.job_id, context))

    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsReply:
        self._authorize(context)
        jobs = self.service.store.list(request.status or None, dict(request.labels))
        return pb.ListJobsReply(job_json=[JobView.of(j).model_dump_json() for j in jobs])

    def CancelJob(self, request: pb.JobRequest, context: grpc.ServicerContext) -> pb.JobReply:
        self._authorize(context)
        self._job(request.job_id, context)
        try:
            self.service.cancel(request.job_id)
        except IllegalTransition as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.JobReply(job_json=self._job(request.job_id, context))

    def WatchJob(self, request: pb.WatchJobRequest, context: grpc.ServicerContext) -> Iterator[pb.JobEvent]:
        self._authorize(context)
        self._job(request.job_id, context)
        seq = request.after
        while context.is_active():
            events = self.service.store.events(request.job_id, after=seq)
            for e in events:
                seq = e["seq"]
                yield pb.JobEvent(seq=seq, kind=e["kind"], data_json=json.dumps({**e["data"], "at": e["at"]}))
            if not events and self.service.is_terminal(request.job_id):
                return
            time.sleep(0.25)


def serve_grpc(service: JobService, token: str, address: str) -> tuple[grpc.Server, int]:
    """Start the coordinator's gRPC API on ``address``; returns the server and its port."""
    return create_server(
        address, lambda s: rpc.add_CoordinatorServicer_to_server(CoordinatorServicer(service, token), s)
    )

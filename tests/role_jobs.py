"""A role's configuration for a TINY job on the shared-memory plane, as Configure gives it, every peer's
address pointing nowhere: the tests that build a role this way replace the calls it makes (and, with the
``peers_share_memory`` fixture, the question to each peer of where it runs), and call its servicer's
methods directly with a ``DirectContext`` (``direct_context()``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import grpc

from tests.params_files import TINY
from weightstream.params import load_params
from weightstream.plan import JobSpec, make_plan
from weightstream.role import shm_tag
from weightstream.transport.plane import PLANE_METADATA, SHARED_MEMORY

CREDENTIAL = "c" * 64
NOWHERE = "127.0.0.1:1"  # nothing listens there


def tiny_role_job(tmp: Path, role: str, **runconfig: Any) -> JobSpec:
    """The JobSpec of ``role`` (worker 0, or the SwarmX root) of TINY with ``runconfig`` on top."""
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(model_dir=str(tmp / "model"), **runconfig)
    params = load_params(raw)
    plan = make_plan(params)
    addresses = {kind: [NOWHERE] * n for kind, n in plan.counts().items()}
    index = plan.root if role == "swarmx" else 0
    return JobSpec(
        params.model_dump(mode="json"),
        plan.to_dict(),
        addresses,
        role,
        index,
        credential=CREDENTIAL,
        shared_memory=True,
    )


def arena_tag(job: JobSpec | None) -> str:
    """The tag of ``job``'s memfds: a job of ``tiny_role_job`` is on the shared-memory plane."""
    tag = shm_tag(job)
    assert tag is not None, "the job is not on the shared-memory plane"
    return tag


class DirectContext:
    """The servicer context of a call made without gRPC: generation 0, from a caller on the data ``plane``
    (shared memory unless told), and an abort raises."""

    def __init__(self, plane: str = SHARED_MEMORY) -> None:
        self.plane = plane

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [(PLANE_METADATA, self.plane)]  # generation 0

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"  # a caller in this process

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code.name}: {details}")


def direct_context(plane: str = SHARED_MEMORY) -> grpc.ServicerContext:
    """A ``DirectContext`` where servicers take a ``grpc.ServicerContext``: it has the methods they call."""
    return cast(grpc.ServicerContext, DirectContext(plane))

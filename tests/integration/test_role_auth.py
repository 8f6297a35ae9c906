"""The role plane is authenticated: a real local job, probed while it trains and fuzzed before it does.

Every RPC of every role (read from the proto's service descriptors, so a new RPC is covered the day it is
added) is called without the job's credential, and with a wrong one, while the job trains: each is
refused with UNAUTHENTICATED, except Health, which answers and says nothing. Then the job finishes with
exactly the losses of an undisturbed run. Roles listen on loopback only, and neither the credential nor
the service's API token is on any role's command line or in its environment.

Fuzzing: once the roles are configured and before the first step, every RPC of every role gets random
bytes with a valid credential; each answers with an error, and the job then trains to the same losses.
"""

from __future__ import annotations

import ipaddress
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from google.protobuf.descriptor import MethodDescriptor

from tests.integration.appliance import TINY
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import load_params
from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.events import JobEvent, RunningEvent, StepEvent
from weightstream.training.runner import JobRunner, RunSummary
from weightstream.transport.auth import TOKEN_METADATA
from weightstream.transport.rpc import OPTIONS

ROLE_SERVICES = {  # gRPC service -> the role kinds that serve it
    "Control": ("memoryx", "swarmx", "activation", "worker"),
    "MemoryX": ("memoryx",),
    "SwarmX": ("swarmx",),
    "Worker": ("worker",),
    "Activation": ("activation",),
}


def role_methods() -> Iterator[tuple[str, MethodDescriptor]]:
    for service, descriptor in pb.DESCRIPTOR.services_by_name.items():
        if service in ROLE_SERVICES:
            for method in descriptor.methods:
                yield service, method


def test_every_role_service_is_known() -> None:
    """Only the coordinator's job API is not a role service: a new role service must be added above."""
    assert set(pb.DESCRIPTOR.services_by_name) == {*ROLE_SERVICES, "Coordinator"}


def raw_call(
    channel: grpc.Channel,
    service: str,
    method: MethodDescriptor,
    payload: bytes,
    metadata: Any,
    timeout: float,
) -> tuple[grpc.StatusCode, bytes | None]:
    """Call any method with raw request bytes; returns the status code and, for unary answers, the reply."""
    path = f"/weightstream.v1.{service}/{method.name}"
    ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
    kind = (method.client_streaming, method.server_streaming)
    try:
        if kind == (False, False):
            reply = channel.unary_unary(path, ident, ident)(payload, metadata=metadata, timeout=timeout)
            return grpc.StatusCode.OK, reply
        if kind == (False, True):
            list(channel.unary_stream(path, ident, ident)(payload, metadata=metadata, timeout=timeout))
        elif kind == (True, False):
            channel.stream_unary(path, ident, ident)(iter([payload]), metadata=metadata, timeout=timeout)
        else:
            list(
                channel.stream_stream(path, ident, ident)(iter([payload]), metadata=metadata, timeout=timeout)
            )
        return grpc.StatusCode.OK, None
    except grpc.RpcError as e:
        return e.code(), None


def params_for(tmp: Path, name: str, max_steps: int) -> Any:
    raw = json.loads(json.dumps(TINY))
    raw["runconfig"].update(max_steps=max_steps, num_csx=2, model_dir=str(tmp / name), checkpoint_steps=0)
    return load_params(raw)


def losses(model_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


Hook = Callable[[JobRunner, JobEvent], None]


def train(tmp: Path, name: str, max_steps: int, hook: Hook) -> tuple[JobRunner, RunSummary]:
    """Run a 2-worker job with real role processes; ``hook(runner, event)`` runs on the runner's thread
    at every event, so the job waits while it probes."""
    params = params_for(tmp, name, max_steps)
    runners: list[JobRunner] = []
    runner = JobRunner(params, LocalProcessBackend(tmp / name / "logs"), lambda e: hook(runners[0], e), name)
    runners.append(runner)
    return runner, runner.run()


def test_roles_refuse_calls_without_the_credential_while_a_job_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the service's API token in this process's environment must not reach any role
    monkeypatch.setenv("WEIGHTSTREAM_TOKEN", "the-service-api-token")
    _, clean = train(tmp_path, "clean", 12, lambda r, e: None)
    probed: dict[str, Any] = {}

    def probe(runner: JobRunner, event: JobEvent) -> None:
        if not isinstance(event, StepEvent) or event.record.step != 2:
            return  # probe once, mid-training, from the runner's own thread: step 3 waits for us
        backend = runner.backend
        assert isinstance(backend, LocalProcessBackend)
        wrong = [(TOKEN_METADATA, "0" * 64)]
        for service, method in role_methods():
            for kind in ROLE_SERVICES[service]:
                for address in runner.addresses[kind]:
                    with grpc.insecure_channel(address, options=OPTIONS) as ch:
                        for metadata in (None, wrong):
                            code, reply = raw_call(ch, service, method, b"", metadata, timeout=10)
                            probed[f"{kind}@{address} {service}/{method.name} {bool(metadata)}"] = (
                                code,
                                reply,
                            )
        for role, proc in backend.procs.items():
            p = psutil.Process(proc.pid)
            listening = [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            assert listening, role
            for addr in listening:
                ip = ipaddress.ip_address(addr.ip)  # gRPC's sockets are dual-stack: ::ffff:127.0.0.1
                ip = getattr(ip, "ipv4_mapped", None) or ip
                assert ip.is_loopback, f"{role.name} listens on {addr}"
            environ, cmdline = p.environ(), " ".join(p.cmdline())
            assert "WEIGHTSTREAM_TOKEN" not in environ, role.name
            assert runner.credential not in cmdline and runner.credential not in json.dumps(environ)
        probed["expected"] = 2 * sum(
            len(runner.addresses[kind]) for service, _ in role_methods() for kind in ROLE_SERVICES[service]
        )

    _, summary = train(tmp_path, "probed", 12, probe)
    assert len(probed) - 1 == probed.pop("expected") > 0
    for name, (code, reply) in probed.items():
        if "Control/Health" in name:
            assert code == grpc.StatusCode.OK, name
            assert pb.HealthReply.FromString(reply) == pb.HealthReply(), f"{name} revealed {reply!r}"
        else:
            assert code == grpc.StatusCode.UNAUTHENTICATED, f"{name}: {code}"
    assert summary.final_step == clean.final_step == 12
    assert losses(tmp_path / "probed") == losses(tmp_path / "clean")


@pytest.mark.slow  # ~9.5 s: kept out of the default suite's time; the credential test stays in it
def test_roles_survive_random_bytes_with_a_valid_credential(tmp_path: Path) -> None:
    train(tmp_path, "clean", 4, lambda r, e: None)
    answers: dict[str, grpc.StatusCode] = {}
    rng = random.Random(1234)

    def fuzz(runner: JobRunner, event: JobEvent) -> None:
        if not isinstance(event, RunningEvent):
            return  # configured, before the first step
        metadata = [(TOKEN_METADATA, runner.credential)]
        for service, method in role_methods():
            if (service, method.name) in {("Control", "Health"), ("Control", "Shutdown")}:
                continue  # Health answers anyone; Shutdown (no request fields) is meant to succeed
            for kind in ROLE_SERVICES[service]:
                for address in runner.addresses[kind]:
                    with grpc.insecure_channel(address, options=OPTIONS) as ch:
                        for trial in range(8):
                            payload = junk(rng, method)
                            code, _ = raw_call(ch, service, method, payload, metadata, timeout=5)
                            answers[f"{kind}@{address} {service}/{method.name} #{trial}"] = code
                        for trial, payload in enumerate(hostile(rng, method, tmp_path)):
                            code, _ = raw_call(ch, service, method, payload, metadata, timeout=5)
                            answers[f"{kind}@{address} {service}/{method.name} hostile #{trial}"] = code

    _, summary = train(tmp_path, "fuzzed", 4, fuzz)
    assert answers
    bad = {k: c for k, c in answers.items() if c == grpc.StatusCode.OK}
    assert not bad, f"accepted random bytes: {bad}"
    assert summary.final_step == 4
    assert losses(tmp_path / "fuzzed") == losses(tmp_path / "clean")
    assert not any((tmp_path / "elsewhere").iterdir()), "a role wrote outside its job's directory"


def junk(rng: random.Random, method: MethodDescriptor) -> bytes:
    """Random bytes that are not a well-formed request: a request that parses could be a legitimate call
    from the coordinator (RunStep of some step), which the credential exists to allow."""
    while True:
        payload = rng.randbytes(rng.choice([1, 7, 64, 4096]))
        if method.client_streaming:
            return payload  # a tensor stream: framing and checksums reject it
        request_type = getattr(pb, method.input_type.name)
        try:
            request_type.FromString(payload)
        except Exception:
            return payload


def hostile(rng: random.Random, method: MethodDescriptor, tmp: Path) -> list[bytes]:
    """Well-formed requests with junk inside, for the methods whose handlers parse what they are sent: a
    job that is not JSON, a checkpoint written anywhere but the job's own directory."""
    if method.name == "Configure":
        texts = [rng.randbytes(64).decode("latin-1"), "{}", '{"role": "worker"}', "[]"]
        return [pb.ConfigureRequest(job_json=t).SerializeToString() for t in texts]
    if method.name == "SaveCheckpoint":
        outside = tmp / "elsewhere"
        outside.mkdir(exist_ok=True)
        targets = [str(outside), str(tmp / "fuzzed" / ".." / "elsewhere")]
        return [
            pb.CheckpointRequest(step=0, directory=d, weights_only=w).SerializeToString()
            for d in targets
            for w in (False, True)
        ]
    return []

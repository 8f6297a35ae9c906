"""The data plane across emulated hosts: a role on one host cannot map another host's memory, so the pair
picks the network and the tensor bytes really cross the link (as a bulk transfer where the roles have bulk
endpoints, as roles run, else inline in the gRPC stream); two roles on one host pick shared memory and
nothing crosses it. Built from the real transport code: a role's Control service with its probe and a push
service reading on the plane its caller chose, and a caller choosing as a role does when it is built."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from testbed import EmulatedHosts, Host

pytestmark = pytest.mark.hosts

Make = Callable[..., EmulatedHosts]
TIMEOUT = 60  # seconds for the caller to choose and push (well under two when the machine is idle)
TOKEN = "d" * 64  # the pair's role credential, handed over stdin as roles get theirs from a file
NBYTES = 4 << 20  # the tensor pushed: 1 Mi float32

# A receiving role on its host's own address (with a bulk endpoint there if argv[1] says "bulk"): reads
# the credential from stdin, prints its port, then one JSON line per push: the plane the caller chose, the
# bytes that came over the gRPC stream, the checksum of the tensor as received.
RECEIVER = """
import json, socket, sys
import grpc
from weightstream.transport import bulk
from weightstream.role import ControlServicer, RoleHost
from weightstream.transport.auth import RoleAuthInterceptor
from weightstream.transport.peers import MemfdProbe, rpc
from weightstream.transport.plane import SharedMemoryPlane, plane_of_call
from weightstream.transport.rpc import create_server, receive_tensors
from weightstream.transport.servicers import register_servicer
from weightstream.transport.shm import job_tag
from weightstream.transport.tensors import checksum

token = sys.stdin.readline().strip()
tag = job_tag(token)
role = RoleHost("memoryx", lambda job: None, token, probe=MemfdProbe(tag))
shared = SharedMemoryPlane(tag)

def push(messages, context):
    plane = plane_of_call(context.invocation_metadata(), shared)
    sizes = []
    def counted():
        for m in messages:
            sizes.append(len(m))
            yield m
    def handle(head, tensors):
        print(json.dumps({"plane": plane.kind, "stream_bytes": sum(sizes),
                          "xxh3": checksum(tensors["w"].view("uint8"))}), flush=True)
    return receive_tensors(context, counted(), handle, plane)

class Receiver(rpc.MemoryXServicer):
    def PushGradients(self, request_iterator, context):
        return push(request_iterator, context)
    def PushGradientsOne(self, request, context):
        return push(iter((request,)), context)
    def unused(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "only pushes in this test")
    GetTensors = GradNormSq = ApplyUpdate = SaveCheckpoint = unused

def register(server):
    rpc.add_ControlServicer_to_server(ControlServicer(role), server)
    register_servicer(rpc.add_MemoryXServicer_to_server, Receiver(), server)

address = socket.gethostbyname(socket.gethostname())
if sys.argv[1] == "bulk":
    bulk.start(address, token)
server, port = create_server(f"{address}:0", register, interceptors=[RoleAuthInterceptor(token)])
print(port, flush=True)
sys.stdin.read()
"""

# A calling role: reads the credential from stdin, chooses the plane to argv[1] as a role does when it is
# built, pushes a tensor of argv[2] bytes on it (with a bulk endpoint on its host's address if argv[3] says
# "bulk"), and prints what it saw: its plane, whether it can map the peer's probe memfd, both host
# identities, the tensor's checksum, and the bytes its link (eth0) sent.
CALLER = """
import json, socket, sys
from weightstream.transport import bulk
import numpy as np
from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.peers import ask_peer, can_map, host_identity, plane_for_peer
from weightstream.transport.plane import SharedMemoryPlane
from weightstream.transport.rpc import open_channel, push_tensors, tensors_in_client
from weightstream.transport.shm import job_tag
from weightstream.transport.tensors import checksum

def link_sent():
    for line in open("/proc/net/dev"):
        name, _, counters = line.partition(":")
        if name.strip() == "eth0":
            return int(counters.split()[8])

token, (address, nbytes, way) = sys.stdin.readline().strip(), sys.argv[1:]
tag = job_tag(token)
if way == "bulk":
    bulk.start(socket.gethostbyname(socket.gethostname()), token)
peer = ask_peer(address, token)
plane = plane_for_peer("receiver", address, token, tag, lambda: SharedMemoryPlane(tag))
w = np.random.default_rng(7).standard_normal(int(nbytes) // 4).astype(np.float32)
push = tensors_in_client(open_channel(address, token, plane=plane.kind), "MemoryX", "PushGradients", pb.Ack)
before = link_sent()
push_tensors("receiver", push, [("w", w)], pb.StreamHead(step=1), plane=plane, bf16=False, timeout=30)
print(json.dumps({"plane": plane.kind, "maps": can_map(peer.probe_pid, peer.probe_fd, tag, peer.host),
                  "mine": host_identity(), "peer": peer.host, "xxh3": checksum(w.view("uint8")),
                  "link_sent": link_sent() - before}))
"""


def _push(receiver_host: Host, caller_host: Host, way: str) -> tuple[dict, dict]:
    """(what the caller saw, what the receiver saw) of one push from ``caller_host`` to ``receiver_host``,
    both with bulk endpoints or neither (``way``: "bulk" or "inline")."""
    receiver = receiver_host.popen(
        [sys.executable, "-c", RECEIVER, way], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdin is not None and receiver.stdout is not None
        receiver.stdin.write(TOKEN + "\n")
        receiver.stdin.flush()
        port = receiver.stdout.readline().strip()
        assert port.isdigit(), "the receiver did not start"
        done = caller_host.run(
            [sys.executable, "-c", CALLER, f"{receiver_host.name}:{port}", str(NBYTES), way],
            input=TOKEN + "\n",
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), json.loads(receiver.stdout.readline())
    finally:
        receiver_host.stop(receiver)


@pytest.mark.parametrize("way", ["bulk", "inline"])
def test_roles_on_two_hosts_cannot_share_memory_and_their_bytes_cross_the_link(
    emulated_hosts: Make, way: str
) -> None:
    cluster = emulated_hosts(2)
    caller, received = _push(cluster["h2"], cluster["h1"], way)
    assert caller["mine"] != caller["peer"] and caller["peer"].startswith("h2/")
    assert caller["maps"] is False  # h1 cannot map h2's probe memfd: its /proc shows no process of h2
    assert caller["plane"] == received["plane"] == "network"
    if way == "bulk":  # the gRPC stream carries the header; h2 fetches the bytes from h1's bulk endpoint...
        assert received["stream_bytes"] < 4096
    else:  # ...or every byte is in the gRPC stream
        assert received["stream_bytes"] >= NBYTES
    assert caller["link_sent"] >= NBYTES  # either way across h1's link
    assert received["xxh3"] == caller["xxh3"]


def test_roles_on_one_host_share_memory_and_nothing_crosses_the_link(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2)
    caller, received = _push(cluster["h1"], cluster["h1"], "bulk")
    assert caller["mine"] == caller["peer"] and caller["peer"].startswith("h1/")
    assert caller["maps"] is True
    assert caller["plane"] == received["plane"] == "shared_memory"
    assert received["stream_bytes"] < 4096  # the header alone: the bytes stayed in the caller's memfd
    assert caller["link_sent"] < NBYTES // 100  # the pair talks over lo, the link stays quiet
    assert received["xxh3"] == caller["xxh3"]

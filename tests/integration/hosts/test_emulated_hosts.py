"""Emulated hosts behave as separate machines: names and TCP between them, nothing shared in memory or PIDs,
rate-limited links, a host that can be killed whole, a link that can be cut, and nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from testbed import EmulatedHosts, Host, running
from tests.waiting import wait_until

pytestmark = pytest.mark.hosts

Make = Callable[..., EmulatedHosts]
TIMEOUT = 30  # seconds for any one command in a host; each takes well under one when the machine is idle

# A TCP server on its host's own address: prints its port, then answers each connection with
# "<hostname>:<what it received>" (one connection with --once).
ECHO_SERVER = """
import socket, sys
server = socket.create_server((socket.gethostbyname(socket.gethostname()), 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(socket.gethostname().encode() + b":" + conn.recv(100))
    if "--once" in sys.argv:
        break
"""

# Connects to argv[1]:argv[2] within argv[3] seconds and prints the answer, or "failed: <error>".
ECHO_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as conn:
        conn.sendall(b"hello")
        print(conn.recv(100).decode())
except OSError as e:
    print(f"failed: {type(e).__name__}")
"""


def python_in(host: Host, code: str, *args: str, timeout: float = TIMEOUT) -> str:
    """Run ``code`` with this interpreter inside ``host``; its stdout, stripped."""
    done = host.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def serve_in(host: Host, code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``code`` inside ``host``; returns the process and the first line it prints (once printed)."""
    proc = host.popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_hosts_have_their_own_names_and_reach_each_other_by_name_over_tcp(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(3)
    for host in cluster:
        assert python_in(host, "import socket; print(socket.gethostname())") == host.name
        routes = host.run(["ip", "route"], capture_output=True, text=True, timeout=TIMEOUT, check=True)
        assert "default" not in routes.stdout  # nothing on a host can reach beyond the switch
    server, port = serve_in(cluster["h2"], ECHO_SERVER, "--once")
    try:
        assert python_in(cluster["h1"], ECHO_CLIENT, "h2", port, "5") == "h2:hello"
    finally:
        cluster["h2"].stop(server)


def test_each_host_has_its_own_network_pid_mount_uts_and_ipc_namespaces(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2)
    kinds = ("net", "pid", "mnt", "uts", "ipc")
    machine = {os.readlink(f"/proc/self/ns/{kind}") for kind in kinds}
    seen = [os.readlink(f"/proc/{host.init_pid}/ns/{kind}") for host in cluster for kind in kinds]
    assert len(set(seen)) == 2 * len(kinds) and machine.isdisjoint(seen)


# Holds a memfd and a /dev/shm file named ws-probe until stdin closes; prints "ready" once they exist.
SHM_HOLDER = """
import os, sys
fd = os.memfd_create("ws-probe")
os.write(fd, b"secret")
open("/dev/shm/ws-probe", "w").write("secret")
print("ready", flush=True)
sys.stdin.read()
"""

# What this host can reach of ws-probe: memfds opened through /proc/<pid>/fd, the /dev/shm file, and how
# many processes it sees.
SHM_PROBE = """
import json, os
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if "memfd:ws-probe" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                found.append(open(f"/proc/{pid}/fd/{fd}").read())
    except OSError:
        pass
print(json.dumps({"memfds": found, "shm": os.path.exists("/dev/shm/ws-probe"),
                  "processes": sum(name.isdigit() for name in os.listdir("/proc"))}))
"""


def test_a_host_cannot_open_another_hosts_memfds_or_shared_memory(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2)
    holder = cluster["h1"].popen(
        [sys.executable, "-c", SHM_HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        same = json.loads(python_in(cluster["h1"], SHM_PROBE))
        other = json.loads(python_in(cluster["h2"], SHM_PROBE))
    finally:
        holder.communicate(timeout=TIMEOUT)
    assert same["memfds"] == ["secret"] and same["shm"]  # the probe finds them where they are
    assert other["memfds"] == [] and not other["shm"]
    assert other["processes"] == 2  # its PID 1 and the probe itself: nothing of h1


# Receives argv[1] connections one after another; prints, for each, its bytes and the seconds from its
# first byte to its end.
BULK_RECEIVER = """
import socket, sys, time
server = socket.create_server((socket.gethostbyname(socket.gethostname()), 0))
print(server.getsockname()[1], flush=True)
for _ in range(int(sys.argv[1])):
    conn, _ = server.accept()
    total, first = 0, None
    while chunk := conn.recv(1 << 20):
        first = first or time.monotonic()
        total += len(chunk)
    print(total, time.monotonic() - first, flush=True)
"""

BULK_SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as conn:
    conn.sendall(bytes(int(sys.argv[3])))
"""


def test_a_rate_limited_link_caps_what_its_host_sends(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(3)
    cluster.set_rate("h1", "100mbit")
    size = 20_000_000  # 1.6 s at 100 Mbit/s; a few tens of ms on an unlimited link
    receiver, port = serve_in(cluster["h3"], BULK_RECEIVER, "2")
    try:
        assert receiver.stdout is not None
        python_in(cluster["h1"], BULK_SENDER, "h3", port, str(size))
        limited = receiver.stdout.readline().split()
        python_in(cluster["h2"], BULK_SENDER, "h3", port, str(size))
        unlimited = receiver.stdout.readline().split()
    finally:
        cluster["h3"].stop(receiver)
    assert int(limited[0]) == int(unlimited[0]) == size
    assert float(limited[1]) >= 1.4, f"20 MB through a 100 Mbit/s link in {limited[1]} s"
    assert float(unlimited[1]) < 1.0, f"20 MB through an unlimited link in {unlimited[1]} s"


def test_killing_a_host_ends_every_process_on_it_and_nothing_else(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2)
    # a foreground command, a background child, a daemon in its own session, an orphan
    work = cluster["h1"].popen(["sh", "-c", "sleep 300 & setsid sleep 301 & (sleep 302 &); exec sleep 303"])
    other = cluster["h2"].popen(["sleep", "300"])
    wait_until(lambda: len(cluster["h1"].processes()) >= 5, "the shell's four sleeps to start", TIMEOUT)
    on_h1 = cluster["h1"].processes()
    assert len(on_h1) == 5  # PID 1 and the four sleeps
    cluster.kill("h1")
    work.wait(timeout=TIMEOUT)
    assert [pid for pid in on_h1 if running(pid)] == []
    assert not cluster["h1"].alive
    links = subprocess.run(
        cluster.switch_command(["ip", "-o", "link"]),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    assert " h1@" not in links and " h2@" in links  # its end of the link went with it
    assert other.poll() is None and len(cluster["h2"].processes()) == 2
    cluster["h2"].stop(other)


def test_a_cut_link_stops_traffic_and_restoring_it_brings_it_back(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2)
    server, port = serve_in(cluster["h2"], ECHO_SERVER)
    try:
        assert python_in(cluster["h1"], ECHO_CLIENT, "h2", port, "5") == "h2:hello"
        cluster.cut("h2")
        assert python_in(cluster["h1"], ECHO_CLIENT, "h2", port, "1").startswith("failed")
        cluster.restore("h2")
        assert python_in(cluster["h1"], ECHO_CLIENT, "h2", port, "5") == "h2:hello"
    finally:
        cluster["h2"].stop(server)


def test_closing_leaves_no_namespace_link_process_or_file(emulated_hosts: Make) -> None:
    cluster = emulated_hosts(2, rate="1gbit")
    cluster["h1"].run(["sh", "-c", "setsid sleep 300 &"], timeout=TIMEOUT, check=True)
    pids = [pid for host in cluster for pid in host.processes()] + [cluster.switch_pid]
    assert len(pids) == 4 and cluster.leftovers() != []  # the check sees a live run
    cluster.close()
    assert cluster.leftovers() == []
    assert [pid for pid in pids if running(pid)] == []
    for listing in (["ip", "netns", "list"], ["ip", "-o", "link", "show"], ["ps", "-eo", "args"]):
        out = subprocess.run(listing, capture_output=True, text=True, timeout=TIMEOUT, check=True).stdout
        assert cluster.tag not in out and str(cluster.dir) not in out

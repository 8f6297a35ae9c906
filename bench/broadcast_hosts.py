"""A broadcast through SwarmX across emulated hosts, for bench/hosts.py: a MemoryX shard on h1, a SwarmX node
on h2 (the parent of two children), and a reader on each of h3 and h4 fetching the same GPT-2 block through
it as a worker does (network plane, checksums checked). Returns the bytes each host's link sent while the
readers read, and how long they read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from testbed import EmulatedHosts
from weightstream.backends.base import RoleSpec, ready_file, role_command
from weightstream.backends.environment import role_env
from weightstream.params import load_params
from weightstream.plan import JobSpec, make_plan
from weightstream.transport.auth import new_role_token

READY_TIMEOUT = 120.0  # seconds for a role to listen (a few when the machine is idle)

# Configures the roles: argv = the jobs file (role address -> JobSpec JSON); the credential on stdin
CONFIGURE = """
import json, sys
from weightstream.proto import weightstream_pb2 as pb, weightstream_pb2_grpc as rpc
from weightstream.transport.rpc import open_channel
token = sys.stdin.readline().strip()
for address, job in json.load(open(sys.argv[1])).items():
    rpc.ControlStub(open_channel(address, token)).Configure(pb.ConfigureRequest(job_json=job), timeout=60)
"""

# Reads unit 1 through SwarmX ``repeats`` times, each a new pass (a cache miss upstream), as a worker on
# another host reads it (on the network plane, with a bulk endpoint of its own, as roles run); prints the
# monotonic clock (one clock for every host) at its start and end
READER = """
import json, socket, sys, time
from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport import bulk
from weightstream.transport.plane import NETWORK, NetworkPlane
from weightstream.transport.rpc import open_channel, tensors_out_client
token, (address, repeats) = sys.stdin.readline().strip(), sys.argv[1:]
bulk.start(socket.gethostbyname(socket.gethostname()), token)
get = tensors_out_client(open_channel(address, token, plane=NETWORK), "SwarmX", "GetUnit", pb.UnitRequest)
plane, peer = NetworkPlane(), bulk.host_of_address(address)
t0 = time.monotonic()
for i in range(int(repeats)):
    plane.read(get(pb.UnitRequest(step=0, unit=1, phase=100 + i)), peer=peer)
sys.stdout.write(json.dumps({"t0": t0, "t1": time.monotonic()}) + "\\n")
"""


def sent_by_host(ip_json: str, names: set[str]) -> dict[str, int]:
    """Bytes each host in ``names`` has sent, from ``ip -j -s link show`` in the switch: a host's link
    ends there in a port named after it, and what that port received is what the host sent."""
    return {d["ifname"]: d["stats64"]["rx"]["bytes"] for d in json.loads(ip_json) if d["ifname"] in names}


def link_sent(hosts: EmulatedHosts) -> dict[str, int]:
    """Bytes each host's link has sent so far."""
    argv = hosts.switch_command(["ip", "-j", "-s", "link", "show"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return sent_by_host(out, {h.name for h in hosts})


def job_raw(hidden: int) -> dict[str, Any]:
    """One GPT-2 block of ``hidden`` (plus embeddings), two workers: SwarmX serves two children."""
    return {
        "train_input": {
            "data_processor": "SyntheticDataProcessor",
            "batch_size": 2,
            "max_sequence_length": 64,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": 1024,
            "hidden_size": hidden,
            "num_hidden_layers": 1,
            "num_heads": max(1, hidden // 64),
            "max_position_embeddings": 64,
        },
        "optimizer": {"optimizer_type": "adamw", "learning_rate": 1e-4},
        "runconfig": {"num_csx": 2, "max_steps": 1, "num_wgt_servers": 1, "seed": 1},
    }


def _wait_ready(path: Path, proc: subprocess.Popen[Any], log: Path) -> str:
    deadline = time.monotonic() + READY_TIMEOUT
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"a role did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return str(json.loads(path.read_text())["address"])


def broadcast(
    hosts: EmulatedHosts, a: Namespace, work: Path, pythonpath: str
) -> tuple[dict[str, int], float]:
    """(bytes each host's link sent, seconds the readers read) for ``a.repeats`` broadcasts of a block of
    hidden size ``a.bw_hidden`` to two readers."""
    token = new_role_token()
    env = {**os.environ, "PYTHONPATH": pythonpath}
    run_dir = work / "broadcast"
    run_dir.mkdir()
    procs: list[tuple[Any, subprocess.Popen[Any]]] = []
    try:
        addrs: dict[str, list[str]] = {"worker": [], "activation": []}
        for kind, host in (("memoryx", hosts["h1"]), ("swarmx", hosts["h2"])):
            role = RoleSpec(kind, 0)
            ready, log = ready_file(run_dir, role), run_dir / f"{kind}.log"
            cmd = role_command(role, host.address, ready)
            with open(log, "wb") as out:
                proc = host.popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**env, **role_env(kind, 1)},
                )
            procs.append((host, proc))
            assert proc.stdin is not None  # stdin=PIPE
            proc.stdin.write(token.encode() + b"\n")
            proc.stdin.close()
            proc.stdin = None  # closed: stop's communicate must not flush it
            addrs[kind] = [_wait_ready(ready, proc, log)]
        params = load_params(job_raw(a.bw_hidden))
        plan = make_plan(params)
        jobs = {
            addrs[kind][0]: JobSpec(
                params.model_dump(mode="json"), plan.to_dict(), addrs, kind, 0, shared_memory=False
            ).to_json()
            for kind in ("memoryx", "swarmx")
        }
        (run_dir / "jobs.json").write_text(json.dumps(jobs))
        hosts["h3"].run(
            [sys.executable, "-c", CONFIGURE, str(run_dir / "jobs.json")],
            input=token + "\n",
            text=True,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        before = link_sent(hosts)
        readers = [
            hosts[name].popen(
                [sys.executable, "-c", READER, addrs["swarmx"][0], str(a.repeats)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for name in ("h3", "h4")
        ]
        outs = [r.communicate(token + "\n", timeout=600) for r in readers]
        after = link_sent(hosts)
        for r, (_, err) in zip(readers, outs, strict=True):
            if r.returncode != 0:
                raise RuntimeError(f"a reader failed: {err[-2000:]}")
        spans = [json.loads(out) for out, _ in outs]
        seconds = max(s["t1"] for s in spans) - min(s["t0"] for s in spans)
        return {h: after[h] - before[h] for h in before}, seconds
    finally:
        for host, proc in procs:
            host.stop(proc)

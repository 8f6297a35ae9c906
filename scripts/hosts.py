"""Emulated hosts by hand (root): bring them up, run commands on them, take them down.

    python scripts/hosts.py up 4 --rate 1gbit [--slurm]   # holds h1..h4 until Ctrl-C or `down`
    python scripts/hosts.py run h2 -- hostname            # a command inside h2
    python scripts/hosts.py run switch -- sinfo           # where the Slurm controller is (SLURM_CONF set)
    python scripts/hosts.py down

``up`` stays in the foreground: the hosts (and the Slurm cluster with --slurm) live as long as it does and
go, leaving nothing behind, when it ends. It writes where they are to a state file (--state, default
$TMPDIR/weightstream-hosts.json), which ``run`` and ``down`` read. testbed/hosts.py says what a host is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # testbed/ is not installed

from testbed import EmulatedHosts, host_command, running
from testbed.slurm import SlurmCluster

DEFAULT_STATE = Path(tempfile.gettempdir()) / "weightstream-hosts.json"


def up(count: int, rate: str | None, slurm: bool, state: Path) -> None:
    if state.exists() and running(json.loads(state.read_text())["pid"]):
        sys.exit(f"emulated hosts are already up ({state}); `down` first or give another --state")
    started = time.monotonic()
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with EmulatedHosts(count, rate=rate) as hosts, contextlib.ExitStack() as stack:
        hosts_up = time.monotonic() - started
        cluster = stack.enter_context(SlurmCluster(hosts)) if slurm else None
        record = {
            "pid": os.getpid(),
            "tag": hosts.tag,
            "switch_pid": hosts.switch_pid,
            "hosts": {h.name: {"address": h.address, "init_pid": h.init_pid} for h in hosts},
            "slurm_conf": cluster.env["SLURM_CONF"] if cluster else None,
        }
        state.write_text(json.dumps(record, indent=1) + "\n")
        try:
            print(
                f"{count} hosts up in {hosts_up:.2f} s"
                + (f", Slurm in {time.monotonic() - started - hosts_up:.2f} s" if cluster else "")
            )
            for h in hosts:
                print(f"  {h.name} {h.address}" + (f" (outgoing {rate})" if rate else ""))
            print(f"`python {sys.argv[0]} down` or Ctrl-C takes them down", flush=True)
            while not stop:
                signal.pause()
        finally:
            state.unlink(missing_ok=True)
    left = hosts.leftovers() + (cluster.leftovers() if cluster else [])
    print(f"down, left behind: {left}" if left else "down: nothing left behind")


def run(name: str, argv: list[str], state: Path) -> int:
    record = json.loads(state.read_text())
    env = dict(os.environ)
    if record["slurm_conf"]:
        env["SLURM_CONF"] = record["slurm_conf"]
    if name == "switch":
        command = ["nsenter", "-t", str(record["switch_pid"]), "-n", *argv]
    elif name in record["hosts"]:
        command = host_command(record["hosts"][name]["init_pid"], argv)
    else:
        sys.exit(f"no host {name!r}: the hosts are {', '.join(record['hosts'])} and switch")
    os.execvpe(command[0], command, env)


def down(state: Path) -> None:
    if not state.exists():
        sys.exit(f"no emulated hosts are up ({state} does not exist)")
    pid = json.loads(state.read_text())["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while running(pid):
        if time.monotonic() > deadline:
            sys.exit(f"`up` ({pid}) still running 60 s after SIGTERM")
        time.sleep(0.1)  # another process: nothing to wait on but its PID


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--state", type=Path, default=DEFAULT_STATE, help="where `up` says where the hosts are"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p_up = commands.add_parser("up", help="bring up N hosts and hold them until Ctrl-C or `down`")
    p_up.add_argument("count", type=int)
    p_up.add_argument("--rate", help="each host's outgoing link rate, tc notation: 100mbit, 1gbit")
    p_up.add_argument("--slurm", action="store_true", help="and a Slurm cluster with every host a node")
    p_run = commands.add_parser("run", help="run a command inside a host (or `switch`)")
    p_run.add_argument("host")
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    commands.add_parser("down", help="take the hosts down")
    args = parser.parse_args()
    if args.command == "up":
        up(args.count, args.rate, args.slurm, args.state)
    elif args.command == "run":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        run(args.host, argv or ["sh"], args.state)
    else:
        down(args.state)


if __name__ == "__main__":
    main()

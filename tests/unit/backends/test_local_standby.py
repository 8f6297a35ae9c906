"""The local backend's spare bookkeeping (backends/local.py), with stand-ins for processes: a lost role is
handed to a ready spare of its kind (the spare's own ready file becomes the role's, the role's log says who
serves it now, a later death is reported with the spare's log), never to a spare still starting or of
another kind; spares that end are forgotten and replaced, and a kind whose spares keep failing to start
gets no more. Real processes: tests/integration/backends/test_local_standby.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import cast

from weightstream.backends.base import RoleSpec, ready_file
from weightstream.backends.local import MAX_SPARE_FAILURES, LocalProcessBackend, Spare


class FakeProcess:
    """What the backend reads of a Popen: its pid, and whether and how it has ended."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def end(self, rc: int) -> None:
        self.returncode = rc


def _popen(p: FakeProcess) -> subprocess.Popen[bytes]:
    return cast("subprocess.Popen[bytes]", p)  # duck-typed: poll, pid, returncode


def _spare(run_dir: Path, kind: str, serial: int, pid: int, ready: bool) -> tuple[Spare, FakeProcess]:
    proc = FakeProcess(pid)
    name = f"standby-{kind}-{serial}"
    spare = Spare(kind, serial, _popen(proc), run_dir / f"{name}.ready.json", run_dir / f"{name}.log")
    if ready:  # what the spare's process writes once it listens
        spare.ready.write_text(json.dumps({"address": f"127.0.0.1:{pid}", "host": "h", "pid": pid}))
    return spare, proc


def test_a_role_goes_to_a_ready_spare_of_its_kind(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    role = RoleSpec("worker", 1)
    starting, _ = _spare(tmp_path, "worker", 0, pid=100, ready=False)
    other_kind, _ = _spare(tmp_path, "swarmx", 1, pid=101, ready=True)
    ready, proc = _spare(tmp_path, "worker", 2, pid=102, ready=True)
    backend.spares = [starting, other_kind, ready]

    assert backend._adopt(role)

    assert backend.procs[role].pid == 102 and backend.logs[role] == ready.log
    assert backend.spares == [starting, other_kind]
    # the role's ready file is the one the spare wrote: its own address and pid
    assert json.loads(ready_file(tmp_path, role).read_text())["pid"] == 102
    assert not ready.ready.exists()
    assert (
        f"worker-1 is now served by standby-worker-2 (pid 102); its log: {ready.log}"
        in (tmp_path / "worker-1.log").read_text()
    )
    proc.end(-9)
    assert backend.dead() == {role: f"worker-1 (pid 102) was killed by SIGKILL; its log: {ready.log}"}


def test_no_ready_spare_no_adoption(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    starting, _ = _spare(tmp_path, "worker", 0, pid=100, ready=False)
    ended, proc = _spare(tmp_path, "worker", 1, pid=101, ready=True)
    proc.end(1)  # its ready file stays, but it no longer runs
    backend.spares = [starting, ended]
    assert not backend._adopt(RoleSpec("worker", 0))
    assert backend.procs == {} and backend.spares == [starting, ended]


def test_a_stopping_backend_hands_no_role_to_a_spare(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    spare, _ = _spare(tmp_path, "worker", 0, pid=100, ready=True)
    backend.spares = [spare]
    backend._stopping = True
    assert not backend._adopt(RoleSpec("worker", 0))
    assert backend.spares == [spare]


def test_a_spare_that_ends_is_replaced_and_is_no_fault_of_the_job(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    backend._kinds, backend._standby = ["memoryx", "worker"], 1
    memoryx, _ = _spare(tmp_path, "memoryx", 0, pid=100, ready=True)
    worker, proc = _spare(tmp_path, "worker", 1, pid=101, ready=True)
    backend.spares = [memoryx, worker]
    assert backend._missing() == []
    proc.end(-9)

    assert backend._missing() == ["worker"]

    assert backend.spares == [memoryx]
    assert backend.dead() == {}  # only roles are the job's
    assert "standby-worker-1 (pid 101) was killed by SIGKILL while serving no role" in worker.log.read_text()


def test_a_kind_whose_spares_keep_failing_to_start_gets_no_more(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    backend._kinds, backend._standby = ["swarmx", "worker"], 2
    for serial in range(MAX_SPARE_FAILURES):
        failing, proc = _spare(tmp_path, "worker", serial, pid=100 + serial, ready=False)
        backend.spares = [failing]
        backend._missing()  # seen running, not ready
        proc.end(1)
        missing = backend._missing()
    assert missing == ["swarmx", "swarmx"]  # no worker any more; the other kind is kept


def test_a_spare_that_was_ready_resets_its_kinds_failures(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    backend._kinds, backend._standby = ["worker"], 1
    for serial in range(MAX_SPARE_FAILURES - 1):
        failing, proc = _spare(tmp_path, "worker", serial, pid=100 + serial, ready=False)
        backend.spares = [failing]
        proc.end(1)
        backend._missing()
    good, _ = _spare(tmp_path, "worker", 9, pid=109, ready=True)
    backend.spares = [good]
    backend._missing()  # seen ready: the kind starts fine
    failing, proc = _spare(tmp_path, "worker", 10, pid=110, ready=False)
    backend.spares = [failing]
    proc.end(1)
    assert backend._missing() == ["worker"]

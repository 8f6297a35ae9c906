"""The local backend's standby processes, as real processes (backends/local.py): a SIGKILLed role is handed
to the spare of its kind, whose pid its ready file then names, and a new spare starts; a spare that dies
is replaced and is no fault of the job; stop ends roles and spares, a spare still starting included."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.faults import ready_pid, still_running
from tests.waiting import wait_until
from weightstream.backends.base import RoleSpec, ready_file
from weightstream.backends.local import LocalProcessBackend, Spare
from weightstream.transport.auth import new_role_token

ROLE = RoleSpec("swarmx", 0)  # any kind: a process is configured only once it serves a role
START_S = 60  # a process start under load (imports numpy, gRPC)


def _ready_spares(backend: LocalProcessBackend) -> list[Spare]:
    return [s for s in backend.spares if s.is_ready()]


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalProcessBackend]:
    b = LocalProcessBackend(tmp_path)
    b.start([ROLE], new_role_token())
    yield b
    b.stop()


def test_a_killed_role_is_served_by_the_spare_and_a_new_spare_starts(
    backend: LocalProcessBackend, tmp_path: Path
) -> None:
    backend.wait_ready(START_S)
    backend.keep_standby(1)
    wait_until(lambda: _ready_spares(backend), "a ready spare", START_S)
    spare = _ready_spares(backend)[0]
    spare_pid, killed = ready_pid(spare.ready), backend.procs[ROLE].pid
    assert spare_pid == spare.proc.pid
    started = {killed, spare_pid}

    os.kill(killed, signal.SIGKILL)
    wait_until(backend.dead, "the role seen dead")
    backend.restart([ROLE])
    backend.wait_ready(timeout_s=1)  # no process start: the spare has listened all along

    assert ready_pid(ready_file(tmp_path, ROLE)) == spare_pid == backend.procs[ROLE].pid
    assert backend.dead() == {}
    assert (
        f"swarmx-0 is now served by {spare.name} (pid {spare_pid})" in (tmp_path / "swarmx-0.log").read_text()
    )
    wait_until(lambda: _ready_spares(backend), "a new spare", START_S)
    started |= {s.proc.pid for s in backend.spares}
    assert len(started) == 3

    backend.stop()
    wait_until(
        lambda: not still_running(started),
        lambda: f"every process gone ({still_running(started)} are not)",
        10,
    )


def test_a_spare_that_dies_is_replaced_and_the_job_sees_no_fault(backend: LocalProcessBackend) -> None:
    backend.wait_ready(START_S)
    backend.keep_standby(1)
    wait_until(lambda: _ready_spares(backend), "a ready spare", START_S)
    first = backend.spares[0]
    first.proc.kill()
    first.proc.wait(timeout=10)
    assert backend.dead() == {} and backend.failures() == []
    wait_until(lambda: _ready_spares(backend), "a spare in place of the one killed", START_S)
    assert backend.spares[0].proc.pid != first.proc.pid
    assert "was killed by SIGKILL while serving no role" in first.log.read_text()


def test_stop_ends_a_spare_still_starting(backend: LocalProcessBackend) -> None:
    backend.wait_ready(START_S)
    backend.keep_standby(1)
    wait_until(lambda: backend.spares, "a spare started")
    spare = backend.spares[0]
    assert not spare.is_ready()  # just started: still importing
    role_pid = backend.procs[ROLE].pid

    backend.stop()

    assert spare.proc.poll() is not None and backend.procs[ROLE].poll() is not None
    assert not still_running({spare.proc.pid, role_pid})
    assert backend._keeper is not None and not backend._keeper.is_alive()  # it starts nothing more


def test_without_standby_a_killed_role_gets_a_new_process(
    backend: LocalProcessBackend, tmp_path: Path
) -> None:
    backend.wait_ready(START_S)
    backend.keep_standby(0)
    killed = backend.procs[ROLE].pid
    os.kill(killed, signal.SIGKILL)
    wait_until(backend.dead, "the role seen dead")
    backend.restart([ROLE])
    backend.wait_ready(START_S)
    assert ready_pid(ready_file(tmp_path, ROLE)) == backend.procs[ROLE].pid != killed
    assert backend.spares == [] and backend._keeper is None

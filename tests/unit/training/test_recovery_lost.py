"""Recovery's diagnosis (training/recovery.py ``Recovery._lost``): a role killed a moment ago refuses the
health probe before the backend sees it exit; it is reported dead, with how it died, not hung. A role the
heartbeats found silent is hung with no probe; one that answered since the fault is not probed."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import weightstream.training.recovery as recovery_module
from weightstream.backends.base import RoleSpec
from weightstream.training.heartbeats import Heartbeats
from weightstream.training.recovery import Recovery

ROLES = [("memoryx", 0), ("swarmx", 0), ("worker", 0)]
VICTIM = RoleSpec("memoryx", 0)


class Backend:
    """Reports the victim dead only from the ``seen_at``-th call of ``dead()`` on."""

    def __init__(self, seen_at: int | None) -> None:
        self.seen_at, self.calls = seen_at, 0

    def dead(self) -> dict[RoleSpec, str]:
        self.calls += 1
        if self.seen_at is not None and self.calls >= self.seen_at:
            return {VICTIM: "memoryx-0 (pid 1) was killed by SIGKILL"}
        return {}


class Plane:
    """The role plane as ``_lost`` sees it: a probe that the victim refuses, recording what it asks."""

    def __init__(self, backend: Backend, heartbeats: Heartbeats, refused: bool = False) -> None:
        """``refused``: the victim's server is closed (it is exiting), rather than silent (stopped)."""
        self.backend, self.heartbeats, self.refused = backend, heartbeats, refused
        self.plan = SimpleNamespace(roles=lambda: ROLES)
        self.processes = lambda: [RoleSpec(k, i) for k, i in ROLES]
        self.address_of = lambda role: f"{role.name}:1"
        self.timeout_s = 30.0
        self.probed: list[tuple[list[RoleSpec], float]] = []

    def probe(self, roles: list[RoleSpec], timeout_s: float) -> dict[RoleSpec, Any]:
        self.probed.append((roles, timeout_s))
        return {r: None if r == VICTIM else object() for r in roles}

    def refusing(self, roles: list[RoleSpec], timeout_s: float) -> set[RoleSpec]:
        return {r for r in roles if r == VICTIM and self.refused}


def recovery(backend: Backend, heartbeats: Heartbeats | None = None, refused: bool = False) -> Recovery:
    """``heartbeats``: none given, a monitor that watches nothing (paused): every role is probed."""
    plane = Plane(backend, heartbeats or Heartbeats(2.0), refused)
    log, cancelled = logging.getLogger("test"), threading.Event()
    no_snapshot = lambda step: Path()  # noqa: E731  (_lost takes none)
    # _lost uses neither the budget nor the worker count
    return Recovery(plane, None, log, lambda *a, **k: None, cancelled, dict, no_snapshot, None)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watched(silent_from: dict[RoleSpec, float]) -> tuple[Heartbeats, Clock]:
    """A monitor of ROLES over rounds at 1000.5, 1001.0, ... 1002.5 (the fake clock's seconds); a role
    answers those before its ``silent_from`` (every round, where not given)."""
    clock = Clock()
    beats = Heartbeats(2.0, interval_s=0.5, clock=clock)

    def ping(role: RoleSpec) -> Any:
        def health(timeout_s: float) -> None:
            if clock.t >= silent_from.get(role, float("inf")):
                raise TimeoutError("DEADLINE_EXCEEDED")

        return health

    beats.watch({RoleSpec(k, i): ping(RoleSpec(k, i)) for k, i in ROLES})
    for _ in range(5):
        clock.t += 0.5
        beats.beat()
    return beats, clock


def test_a_role_whose_exit_is_seen_after_the_probe_is_reported_dead() -> None:
    lost = recovery(Backend(seen_at=3))._lost(since=0.0)  # not dead before the probe, nor just after it
    assert lost == {VICTIM: "memoryx-0 (pid 1) was killed by SIGKILL"}


def test_a_role_that_stays_up_without_answering_is_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_module, "EXIT_GRACE_S", 0.3)  # how long it looks again is not the point
    backend = Backend(seen_at=None)
    lost = recovery(backend)._lost(since=0.0)
    assert list(lost) == [VICTIM] and "(hung); killed" in lost[VICTIM]
    assert backend.calls > 2  # looked again for a while before calling it hung


def test_a_role_the_heartbeats_found_silent_is_hung_at_once_and_only_roles_of_no_verdict_are_probed() -> None:
    """The victim (SIGSTOPped) has not answered for 2.5 s: hung, with no probe and no wait for its exit.
    The SwarmX node answered a heartbeat since the fault: alive, no probe. The worker's last answer is
    from before the fault: probed, with the heartbeat timeout as the deadline (it answers)."""
    worker = RoleSpec("worker", 0)
    beats, _ = watched({VICTIM: 1000.0, worker: 1002.0})
    backend = Backend(seen_at=None)
    rec = recovery(backend, beats)
    lost = rec._lost(since=1002.2)  # the last round (1002.5) came after the fault
    assert lost == {VICTIM: "memoryx-0 did not answer heartbeats for 2.5s (hung); killed"}
    assert rec.roles.probed == [([worker], 2.0)]  # type: ignore[attr-defined]
    assert backend.calls == 2  # one look for its exit: its 2.5 s of silence were its grace


def test_a_silent_role_the_backend_then_sees_dead_is_reported_dead_with_how_it_died() -> None:
    beats, _ = watched({VICTIM: 1000.0})
    rec = recovery(Backend(seen_at=2), beats)
    assert rec._lost(since=0.0) == {VICTIM: "memoryx-0 (pid 1) was killed by SIGKILL"}
    assert rec.roles.probed == []  # type: ignore[attr-defined]


def test_a_silent_role_whose_server_refuses_calls_is_exiting_and_gets_its_grace_from_now() -> None:
    """Stopping on SIGTERM, a role closes its server at once and may take seconds more to exit: silent
    for the heartbeat timeout, it is not hung but on its way out, and is reported with how it ended."""
    beats, _ = watched({VICTIM: 1000.0})
    backend = Backend(seen_at=4)  # seen dead a few looks after the verdict of silence
    rec = recovery(backend, beats, refused=True)
    assert rec._lost(since=0.0) == {VICTIM: "memoryx-0 (pid 1) was killed by SIGKILL"}

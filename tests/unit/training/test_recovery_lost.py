"""Recovery's diagnosis (training/recovery.py ``Recovery._lost``): a role killed a moment ago refuses the
health probe before the backend sees it exit; it is reported dead, with how it died, not hung."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import weightstream.training.recovery as recovery_module
from weightstream.backends.base import RoleSpec
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


def recovery(backend: Backend) -> Recovery:
    def probe(roles: list[RoleSpec], timeout_s: float) -> dict[RoleSpec, Any]:
        return {r: None if r == VICTIM else object() for r in roles}  # the victim refuses

    plane = SimpleNamespace(
        backend=backend,
        processes=lambda: [RoleSpec(k, i) for k, i in ROLES],
        address_of=lambda role: f"{role.name}:1",
        timeout_s=30.0,
        probe=probe,
    )
    log, cancelled = logging.getLogger("test"), threading.Event()
    no_snapshot = lambda step: Path()  # noqa: E731  (_lost takes none)
    # _lost uses neither the budget nor the worker count
    return Recovery(plane, None, log, lambda *a, **k: None, cancelled, dict, no_snapshot, None)  # type: ignore[arg-type]


def test_a_role_whose_exit_is_seen_after_the_probe_is_reported_dead() -> None:
    lost = recovery(Backend(seen_at=3))._lost()  # not dead before the probe, nor just after it
    assert lost == {VICTIM: "memoryx-0 (pid 1) was killed by SIGKILL"}


def test_a_role_that_stays_up_without_answering_is_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_module, "EXIT_GRACE_S", 0.3)  # how long it looks again is not the point
    backend = Backend(seen_at=None)
    lost = recovery(backend)._lost()
    assert list(lost) == [VICTIM] and "(hung); killed" in lost[VICTIM]
    assert backend.calls > 2  # looked again for a while before calling it hung

"""A local backend that can run out of room for workers, for the tests of elastic workers: the one decision
("no capacity for this role now") that a local machine never makes. Everything else is the real local
backend's: real role processes, really killed, retired and started again."""

from __future__ import annotations

import threading
from pathlib import Path

from weightstream.backends.base import NoCapacityError, RoleSpec
from weightstream.backends.local import LocalProcessBackend


class NoRoomForWorkers(LocalProcessBackend):
    """``LocalProcessBackend`` whose ``restart`` has no room for workers while ``refusing`` is set: it
    kills each worker asked for that still runs, starts the other roles, and raises NoCapacityError naming
    the workers. ``refused`` and ``started`` count its workers refused and started again, under ``changed``
    (a test waits on it)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.refusing = threading.Event()
        self.changed = threading.Condition()
        self.refused = self.started = 0

    def restart(self, roles: list[RoleSpec]) -> None:
        refused = [r for r in roles if r.kind == "worker" and self.refusing.is_set()]
        for role in refused:
            proc = self.procs.get(role)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        super().restart([r for r in roles if r not in refused])
        with self.changed:
            self.refused += len(refused)
            self.started += sum(r.kind == "worker" for r in roles) - len(refused)
            self.changed.notify_all()
        if refused:
            raise NoCapacityError(refused, "this test's backend has no room for workers now")

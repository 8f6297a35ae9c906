"""A job cancelled while its roles are starting ends as cancelled: the local backend's wait for them says
it was stopped, even when the stop came before any role process was spawned (no process to wait for)."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.backends.base import BackendError, RoleSpec
from weightstream.backends.local import LocalProcessBackend


def test_a_stop_before_any_role_started_is_not_an_empty_ready(tmp_path: Path) -> None:
    backend = LocalProcessBackend(tmp_path)
    backend.stop()  # a cancel that wins the race with start()
    backend.start([RoleSpec("memoryx", 0), RoleSpec("worker", 0)], "token")
    assert backend.procs == {}  # nothing was spawned after the stop
    with pytest.raises(BackendError, match="stopped while starting"):
        backend.wait_ready(timeout_s=5)

"""The heartbeat monitor (training/heartbeats.py) and what the role plane makes of it: a role silent for
the timeout is unresponsive, and a step waiting on it fails naming it. A fake clock and fake Health calls
drive the monitor's rounds by hand; one test runs its thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.waiting import wait_until
from weightstream.backends.base import RoleSpec
from weightstream.training.errors import RoleFault
from weightstream.training.heartbeats import Heartbeats
from weightstream.training.roles import RolePlane

W0, W1, M0 = RoleSpec("worker", 0), RoleSpec("worker", 1), RoleSpec("memoryx", 0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Roles:
    """Fake Health calls: a role answers unless it is in ``hung``; records each call's deadline."""

    def __init__(self) -> None:
        self.hung: set[RoleSpec] = set()
        self.deadlines: list[tuple[RoleSpec, float]] = []

    def ping(self, role: RoleSpec) -> Any:
        def health(timeout_s: float) -> None:
            self.deadlines.append((role, timeout_s))
            if role in self.hung:
                raise TimeoutError("DEADLINE_EXCEEDED")

        return health

    def pings(self, *roles: RoleSpec) -> dict[RoleSpec, Any]:
        return {r: self.ping(r) for r in roles}


def monitor(*roles: RoleSpec, timeout_s: float = 2.0) -> tuple[Heartbeats, Clock, Roles]:
    clock, fake = Clock(), Roles()
    beats = Heartbeats(timeout_s, interval_s=0.5, clock=clock)
    beats.watch(fake.pings(*roles))
    return beats, clock, fake


def run_for(beats: Heartbeats, clock: Clock, seconds: float) -> None:
    """The monitor's rounds over ``seconds`` of the fake clock, one every interval."""
    for _ in range(round(seconds / beats.interval_s)):
        clock.t += beats.interval_s
        beats.beat()


def test_a_role_silent_for_the_timeout_is_unresponsive_with_the_time_since_its_last_answer() -> None:
    beats, clock, roles = monitor(W0, W1, M0)
    run_for(beats, clock, 3.0)
    assert beats.unresponsive() == {}  # everyone answers
    roles.hung.add(W1)  # stopped right after its last answer, at 1003.0
    run_for(beats, clock, 1.5)
    assert beats.unresponsive() == {}  # 1.5 s of silence: not yet
    run_for(beats, clock, 0.5)
    assert beats.unresponsive() == {W1: pytest.approx(2.0)}
    assert beats.unresponsive("memoryx") == {}  # by kind: what a call to the shards waits on
    clock.t += 0.3
    assert beats.unresponsive("worker") == {W1: pytest.approx(2.3)}
    assert Heartbeats.message(W1, 2.3) == "worker-1 did not answer heartbeats for 2.3s (hung)"
    # every call had the timeout as its deadline: an answer later than that is of no use
    assert {d for _, d in roles.deadlines} == {2.0}


def test_an_answer_again_clears_the_verdict() -> None:
    beats, clock, roles = monitor(W0)
    roles.hung.add(W0)
    run_for(beats, clock, 2.5)
    assert W0 in beats.unresponsive()
    roles.hung.clear()
    run_for(beats, clock, 0.5)
    assert beats.unresponsive() == {} and beats.silence(W0) == 0.0
    assert beats.longest_silence == (3.0, "worker-0")  # for run.log: how close it came (here: past)


def test_a_role_is_not_blamed_for_heartbeats_the_coordinator_never_sent() -> None:
    """The coordinator itself stalled (no rounds for 5 s): the roles had no chance to answer."""
    beats, clock, _ = monitor(W0)
    clock.t += 5.0
    assert beats.unresponsive() == {}
    beats.beat()  # answered at once
    assert beats.unresponsive() == {}


def test_a_silent_role_is_judged_once_a_heartbeat_has_waited_an_interval() -> None:
    beats, clock, roles = monitor(W0)
    roles.hung.add(W0)
    clock.t += 5.0  # no round meanwhile: the coordinator was stalled
    beats.beat()
    assert beats.unresponsive() == {}  # asked just now
    clock.t += 0.5
    assert beats.unresponsive() == {W0: pytest.approx(5.5)}


def test_no_verdict_while_paused_and_a_new_configuration_starts_fresh() -> None:
    beats, clock, roles = monitor(W0, W1)
    roles.hung.add(W0)
    run_for(beats, clock, 1.5)
    beats.pause()  # the coordinator replaces W0 and configures every role again
    run_for(beats, clock, 5.0)
    assert beats.unresponsive() == {} and beats.silence(W0) is None
    assert not beats.answered_since(W1, 0.0)
    roles.hung.clear()  # W0's replacement answers
    beats.watch(roles.pings(W0, W1))
    configured = clock.t
    assert beats.silence(W0) == 0.0 and beats.answered_since(W0, configured)
    run_for(beats, clock, 3.0)
    assert beats.unresponsive() == {}


def test_the_answer_of_an_earlier_configuration_is_dropped() -> None:
    """A heartbeat sent before a (re)configuration and answered after it says nothing of the new one."""
    beats, clock, roles = monitor(W0)

    def answer_after_a_new_configuration(timeout_s: float) -> None:
        beats.watch({W0: roles.ping(W0)})  # the coordinator configured the roles meanwhile

    beats.watch({W0: answer_after_a_new_configuration})
    clock.t += 0.5
    beats.beat()
    assert beats.answers == 0


def test_the_monitor_thread_finds_a_hung_role_while_the_others_answer_on() -> None:
    """Real threads and clock: the hung role's calls wait out their deadline, one at a time, and hold up
    no other role's."""
    stop = threading.Event()
    lock = threading.Lock()
    waiting, most_waiting = 0, 0

    def hung(timeout_s: float) -> None:  # SIGSTOPped: each call waits out its deadline
        nonlocal waiting, most_waiting
        with lock:
            waiting += 1
            most_waiting = max(most_waiting, waiting)
        stop.wait(timeout_s)
        with lock:
            waiting -= 1
        raise TimeoutError("DEADLINE_EXCEEDED")

    beats = Heartbeats(0.4, interval_s=0.05)
    beats.watch({W0: lambda timeout_s: None, W1: hung})
    beats.start()
    try:
        wait_until(lambda: W1 in beats.unresponsive(), "worker-1 to be found hung", timeout=10)
        assert W0 not in beats.unresponsive()
        answered = beats.answers
        wait_until(lambda: beats.answers > answered + 3, "worker-0 to answer on", timeout=10)
        assert most_waiting == 1  # no queue of calls behind the hung role
    finally:
        stop.set()
        beats.close()


# -- the role plane ------------------------------------------------------------------------------------
class NoFailures:
    def failures(self) -> list[str]:
        return []


class Counts:
    def counts(self) -> dict[str, int]:
        return {"memoryx": 1, "worker": 2, "swarmx": 1, "activation": 1}


@pytest.fixture
def plane() -> Any:
    roles = RolePlane(NoFailures(), Counts(), {"runconfig": {}}, "job", "t" * 64, 60.0)  # type: ignore[arg-type]
    yield roles
    roles.close()


def hang_w1(plane: RolePlane) -> None:
    beats, clock, roles = monitor(W0, W1, M0)
    roles.hung.add(W1)
    run_for(beats, clock, 2.5)
    plane.heartbeats = beats


def test_check_roles_fails_a_step_naming_the_role_that_stopped_answering(plane: RolePlane) -> None:
    plane.check_roles()  # nothing watched before the first configuration
    hang_w1(plane)
    with pytest.raises(RoleFault, match=r"^worker-1 did not answer heartbeats for 2\.5s \(hung\)$"):
        plane.check_roles()


def test_every_role_of_a_silent_host_is_named_at_once(plane: RolePlane) -> None:
    """A host cut off silences all of its roles together: the fault names each, by kind and index."""
    beats, clock, roles = monitor(W0, W1, M0)
    roles.hung |= {W1, M0, W0}
    run_for(beats, clock, 2.5)
    plane.heartbeats = beats
    with pytest.raises(RoleFault) as e:
        plane.check_roles()
    assert [part.split()[0] for part in str(e.value).split("; ")] == ["memoryx-0", "worker-0", "worker-1"]


def test_a_call_waiting_on_a_hung_role_fails_long_before_its_deadline(plane: RolePlane) -> None:
    """Even unwatched (``watch=False``: other roles' deaths do not matter to it), a call fails once a role
    it waits on is hung; a hung role it does not wait on leaves it alone."""
    hang_w1(plane)
    released = threading.Event()
    try:
        with pytest.raises(RoleFault, match="worker-1 did not answer heartbeats"):
            plane.all("worker", lambda i: released.wait(60.0), 60.0, watch=False)
        assert plane.all("memoryx", lambda i: i, 60.0, watch=False) == [0]
    finally:
        released.set()

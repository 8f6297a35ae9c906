"""Whether a lost role's node still answers (backends/slurm/reach.py), on loopback: a node that accepts or
refuses a connection to the role's address answers, an address that cannot be tried does not; and the
sruns of lost roles, waited for where their node answers, killed at once where it does not."""

from __future__ import annotations

import socket
import subprocess

from weightstream.backends.slurm.reach import answers, end_sruns


def test_a_listening_role_and_a_gone_one_both_mean_the_node_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # a hung role: its kernel still accepts
        port = server.getsockname()[1]
        assert answers(f"127.0.0.1:{port}")
    assert answers(f"127.0.0.1:{port}")  # its process gone: the kernel refuses, the node is up


def test_an_address_that_cannot_be_tried_does_not_answer() -> None:
    assert not answers("127.0.0.1:port")
    assert not answers("")


class FakeSrun:
    """An srun that ends by itself (``ends``) or only when killed; records the timeouts it was waited for."""

    def __init__(self, ends: bool) -> None:
        self.ended, self.killed = ends, False
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if not self.ended:
            raise subprocess.TimeoutExpired("srun", timeout or 0.0)
        return 0

    def kill(self) -> None:
        self.killed = self.ended = True


def test_sruns_of_nodes_that_answer_are_waited_for_the_others_killed_at_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        up = f"127.0.0.1:{server.getsockname()[1]}"
        sruns = {"ended": FakeSrun(True), "stuck": FakeSrun(False), "silent": FakeSrun(False)}
        addresses = {"ended": up, "stuck": up, "silent": "127.0.0.1:port"}  # the last cannot be reached
        stuck = end_sruns(sruns, addresses, grace_s=0.2)  # type: ignore[arg-type]  # fakes, not Popens
    assert stuck == {"stuck", "silent"}
    assert sruns["silent"].waits[0] == 0.0  # its node did not answer: not waited for
    assert 0.0 < (sruns["stuck"].waits[0] or 0.0) <= 0.2  # its node answered: given the grace, then killed
    assert sruns["stuck"].killed and sruns["silent"].killed and not sruns["ended"].killed

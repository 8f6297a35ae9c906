"""Whether a lost role's node still answers (backends/slurm/reach.py), on loopback: a node that accepts or
refuses a connection to the role's address answers; an address that cannot be tried does not."""

from __future__ import annotations

import socket

from weightstream.backends.slurm.reach import answers


def test_a_listening_role_and_a_gone_one_both_mean_the_node_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # a hung role: its kernel still accepts
        port = server.getsockname()[1]
        assert answers(f"127.0.0.1:{port}")
    assert answers(f"127.0.0.1:{port}")  # its process gone: the kernel refuses, the node is up


def test_an_address_that_cannot_be_tried_does_not_answer() -> None:
    assert not answers("127.0.0.1:port")
    assert not answers("")

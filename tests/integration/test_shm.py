"""The shared-memory data plane (transport/shm.py) across processes: a memfd made by another process is
mapped and outlives it. The rest is in tests/unit/transport/test_shm.py."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np

from weightstream.transport.shm import job_tag
from weightstream.transport.tensors import read_messages

_CHILD = """
import sys, numpy as np
from weightstream.transport.shm import REFERENCES_ONLY, SharedArena
from weightstream.transport.tensors import tensor_messages
arena = SharedArena(sys.argv[1])
w = arena.empty((256, 4))
w[...] = np.arange(w.size, dtype=np.float32).reshape(w.shape)
(msg,) = tensor_messages([("w", w)], shm=REFERENCES_ONLY)
sys.stdout.buffer.write(msg)
sys.stdout.flush()
sys.stdin.read()  # hold the memfd open until the parent has mapped it
"""


TAG = job_tag("a" * 64)


def test_another_process_memfd_is_mapped_and_outlives_it() -> None:
    cmd = [sys.executable, "-c", _CHILD, TAG]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as child:
        assert isinstance(child.stdout, io.BufferedReader) and child.stdin is not None
        msg = child.stdout.read1(1 << 16)
        _, out = read_messages([msg], TAG)
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    # the sender has exited (its memfd closed): the mapping keeps the memory
    np.testing.assert_array_equal(out["w"].reshape(-1), np.arange(1024, dtype=np.float32))

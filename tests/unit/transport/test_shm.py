"""The shared-memory data plane (transport/shm.py): tensors travel as a header naming memfds, mapped read-only
by the receiver, checked end to end, confined to the job's own memfds, and nothing leaks. Across processes:
tests/integration/test_shm.py."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from weightstream.proto import weightstream_pb2 as pb
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.shm import REFERENCES_ONLY, SharedArena, job_tag, locate
from weightstream.transport.tensors import read_messages, tensor_messages

TAG = job_tag("a" * 64)


def _fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _exists(fd)}


def _exists(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


def test_weights_travel_by_reference_and_are_mapped_read_only() -> None:
    arena = SharedArena(TAG)
    w = arena.empty((64, 32))
    w[...] = np.arange(w.size, dtype=np.float32).reshape(w.shape)
    msgs = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))
    assert len(msgs) == 1 and len(msgs[0]) < 200  # the header alone: the 8 KiB stay in the memfd
    _, out = read_messages(msgs, TAG)
    np.testing.assert_array_equal(out["w"], w)
    assert not out["w"].flags.writeable  # a receiver cannot corrupt the sender's weights
    with pytest.raises(ValueError, match="read-only"):
        out["w"][0, 0] = 1.0
    # a mapping of the same memory, not a copy: the owner's in-place update shows through
    w[0, 0] = 42.0
    assert out["w"][0, 0] == 42.0
    arena.close()


def test_bytes_are_checked_on_the_shared_memory_path_too() -> None:
    arena = SharedArena(TAG)
    w = arena.empty((128,))
    w[...] = 1.0
    msgs = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))
    w[7] = 2.0  # changed after the header (and its checksum) left: the receiver must notice
    with pytest.raises(ChecksumError, match="'w'"):
        read_messages(msgs, TAG)
    arena.close()


def test_fresh_arrays_are_copied_once_into_scratch_that_the_lease_closes() -> None:
    arena = SharedArena(TAG)
    grads: dict[str, np.ndarray] = {
        "a": np.full((1000,), 3.0, np.float32),
        "b": np.arange(10, dtype=np.int64),
        "c": np.zeros(0, np.float32),
    }
    before = sum("memfd:" in t for t in _fds())
    with arena.lease() as scratch:
        msgs = list(tensor_messages(grads.items(), pb.StreamHead(step=3, unit=1), shm=scratch))
        assert len(msgs) == 1 and len(msgs[0]) < 300
        assert sum("memfd:" in t for t in _fds()) == before + 1  # one memfd for all of them
        head, out = read_messages(msgs, TAG)
    assert sum("memfd:" in t for t in _fds()) == before  # closed when the call is over...
    for k, v in grads.items():
        np.testing.assert_array_equal(out[k], v)  # ...while the receiver's mapping stays valid
    assert head is not None and head.step == 3
    # a relay sends what it received by reference again: no new copy
    loc = locate(out["a"])
    assert loc is not None and loc.pid == os.getpid()
    arena.close()


def test_bfloat16_on_the_shared_memory_plane_is_a_converted_copy() -> None:
    arena = SharedArena(TAG)
    w = arena.empty((16,))
    w[...] = 1.5
    with arena.lease() as scratch:
        msgs = list(tensor_messages([("w", w)], bf16=True, shm=scratch))
        _, out = read_messages(msgs, TAG)
    np.testing.assert_array_equal(out["w"], w)  # 1.5 is exact in bfloat16
    arena.close()


def test_only_the_jobs_own_memfds_are_opened() -> None:
    arena = SharedArena(TAG)
    w = arena.empty((8,))
    msgs = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))
    with pytest.raises(ProtocolError, match="not one of this job's memfds"):
        read_messages(msgs, job_tag("b" * 64))  # another job's tag
    with pytest.raises(ProtocolError, match="may not use"):
        read_messages(msgs, None)  # a receiver off the plane never maps anything
    # a header pointing at an ordinary file this process has open is refused too
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"\0" * 64)
        f.flush()
        header = pb.TensorSetHeader()
        header.tensors.add(
            name="x", dtype="float32", shape=[4], nbytes=16, shm_pid=os.getpid(), shm_fd=f.fileno()
        )
        raw = header.SerializeToString()
        with pytest.raises(ProtocolError, match="not one of this job's memfds"):
            read_messages([len(raw).to_bytes(4, "little") + raw], TAG)
    # and a range past the memfd's end
    header = pb.TensorSetHeader.FromString(msgs[0][4:])
    header.tensors[0].offset = 4096
    raw = header.SerializeToString()
    with pytest.raises(ProtocolError, match="extends past"):
        read_messages([len(raw).to_bytes(4, "little") + raw], TAG)
    arena.close()


def test_a_sender_that_is_gone_gives_a_clear_error() -> None:
    header = pb.TensorSetHeader()
    header.tensors.add(name="x", dtype="float32", shape=[4], nbytes=16, shm_pid=2**22 - 1, shm_fd=5)
    raw = header.SerializeToString()
    with pytest.raises(ProtocolError, match=r"cannot open shared memory .*data_plane: grpc"):
        read_messages([len(raw).to_bytes(4, "little") + raw], TAG)


def test_memfds_are_named_by_the_job_tag_which_does_not_reveal_the_credential() -> None:
    token = "0123456789abcdef" * 4
    arena = SharedArena(job_tag(token))
    w = arena.empty((4,))
    loc = locate(w)
    assert loc is not None
    name = Path(f"/proc/self/fd/{loc.fd}").readlink().name
    assert name.startswith("memfd:weightstream-" + job_tag(token)) and token not in name
    arena.release(w)
    assert not _exists(str(loc.fd)) or "memfd:weightstream" not in os.readlink(f"/proc/self/fd/{loc.fd}")
    arena.close()

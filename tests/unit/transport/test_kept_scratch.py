"""Gradient memfds kept from step to step (transport/shm.py's KeptScratch, used by the workers' pushes):
the same memfd is written again for the same unit, other calls never share its bytes, the budget holds,
and nothing leaks."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.role_jobs import tiny_role_job
from tests.swarmx_fakes import push_through
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import shm_tag
from weightstream.swarmx import service as swarmx_service
from weightstream.transport.plane import SharedMemoryPlane
from weightstream.transport.rpc import push_tensors
from weightstream.transport.shm import KeptScratch, SharedArena, job_tag, locate
from weightstream.transport.tensors import read_messages, tensor_messages
from weightstream.worker import service as worker_service

# roles built here ask peers that do not exist where they run: they answer "this host"
pytestmark = pytest.mark.usefixtures("peers_share_memory")

TAG = job_tag("k" * 64)


def _memfds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # an fd closed since the listing
            n += "memfd:" in os.readlink(f"/proc/self/fd/{fd}")
    return n


def _push(kept: KeptScratch, unit: int, grads: dict[str, np.ndarray]) -> tuple[list[bytes], dict]:
    """What a worker's push does on the shared-memory plane: place, send the header, receiver reads."""
    with kept.lease(unit) as scratch:
        msgs = list(tensor_messages(grads.items(), pb.StreamHead(step=1, unit=unit), shm=scratch))
        _, out = read_messages(msgs, TAG)
    return msgs, out


def test_a_units_gradients_go_into_the_same_memfd_every_step() -> None:
    arena = SharedArena(TAG)
    kept = KeptScratch(arena, 1 << 20)
    before = _memfds()
    locations = []
    for step in range(3):
        g = {"w": np.full((256,), float(step), np.float32), "b": np.arange(8, dtype=np.float32) + step}
        _, out = _push(kept, 5, g)
        for k, v in g.items():
            np.testing.assert_array_equal(out[k], v)
        loc = locate(out["w"])
        assert loc is not None
        locations.append((os.stat(f"/proc/self/fd/{loc.fd}").st_ino, loc.offset))
    assert len(set(locations)) == 1  # one memfd, written again each step
    assert _memfds() == before + 1  # kept open between calls, and only one
    assert kept.kept_bytes >= 256 * 4 + 8 * 4
    kept.close()
    assert _memfds() == before
    arena.close()


def test_units_do_not_share_buffers_and_the_budget_holds() -> None:
    arena = SharedArena(TAG)
    kept = KeptScratch(arena, 3000)  # room for one unit's 2 KiB, not two
    before = _memfds()
    a = {"w": np.full((512,), 1.0, np.float32)}
    b = {"w": np.full((512,), 2.0, np.float32)}
    _, out_a = _push(kept, 0, a)
    _, out_b = _push(kept, 1, b)  # over the budget: a fresh memfd, closed after the call
    np.testing.assert_array_equal(out_a["w"], 1.0)  # unit 1 did not write over unit 0's bytes
    np.testing.assert_array_equal(out_b["w"], 2.0)
    assert kept.kept_bytes <= 3000
    assert _memfds() == before + 1  # unit 0's kept memfd only
    loc_a, loc_b = locate(out_a["w"]), locate(out_b["w"])
    assert loc_a is not None and loc_b is not None and loc_a.fd != loc_b.fd
    kept.close()
    arena.close()


def test_a_larger_gradient_grows_the_buffer_and_closes_the_old_one() -> None:
    arena = SharedArena(TAG)
    kept = KeptScratch(arena, 1 << 20)
    before = _memfds()
    _, small = _push(kept, 0, {"w": np.full((16,), 1.0, np.float32)})
    _, large = _push(kept, 0, {"w": np.full((4096,), 2.0, np.float32)})
    np.testing.assert_array_equal(small["w"], 1.0)  # the old mapping stays valid for its receiver
    np.testing.assert_array_equal(large["w"], 2.0)
    assert _memfds() == before + 1
    kept.close()
    arena.close()


def test_two_calls_for_one_unit_at_once_never_share_bytes() -> None:
    """A second call under a key whose buffer is in use (two attempts of one step) gets a fresh memfd,
    closed when it ends; so does a second allocation within one call."""
    arena = SharedArena(TAG)
    kept = KeptScratch(arena, 1 << 20)
    before = _memfds()
    with kept.lease(3) as first:
        x = first.alloc(1024)
        x[:] = 7
        with kept.lease(3) as second:
            y = second.alloc(1024)
            y[:] = 9
            assert _memfds() == before + 2
        z = first.alloc(1024)  # a second allocation in the same call
        z[:] = 11
        assert (x == 7).all() and (y == 9).all()
        lx, lz = locate(x), locate(z)
        assert lx is not None and lz is not None and lx.fd != lz.fd
    assert _memfds() == before + 1
    kept.close()
    arena.close()


def test_concurrent_pushes_of_different_units_keep_their_own_bytes() -> None:
    arena = SharedArena(TAG)
    kept = KeptScratch(arena, 1 << 22)
    errors: list[BaseException] = []

    def pusher(unit: int) -> None:
        try:
            for step in range(20):
                g = {"w": np.full((4096,), float(unit * 100 + step), np.float32)}
                _, out = _push(kept, unit, g)
                np.testing.assert_array_equal(out["w"], g["w"])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=pusher, args=(u,)) for u in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    kept.close()
    arena.close()


@pytest.mark.parametrize(
    ("storage", "budget_mb", "keeps"), [("memory", None, True), ("disk", None, False), ("memory", 64, False)]
)
def test_workers_keep_gradient_memfds_only_over_the_memory_store_without_a_budget(
    tmp_path: Path, storage: str, budget_mb: int | None, keeps: bool
) -> None:
    """With MemoryX's memory store the kept pages are the ones MemoryX holds the gradients in; with
    its disk store they would be the worker's alone, so the worker keeps none; nor with a worker memory
    budget (``worker_memory_mb``), which kept memfds would stay outside. The worker role as Configure
    builds it."""
    job = tiny_role_job(tmp_path, "worker", memoryx_storage=storage, worker_memory_mb=budget_mb)
    engine = worker_service.build(job)
    assert isinstance(engine.units, worker_service.SwarmParent)
    assert isinstance(engine.units.plane, SharedMemoryPlane)
    kept = engine.units.plane.kept
    assert (kept is not None) is keeps
    if kept is not None:
        assert kept.max_bytes >= 512 << 20  # a GPT-2 d768/L12's whole gradient (366 MB) fits
    # its pushes: the same memfd for a unit step after step where it keeps them, a fresh one otherwise
    memfds = []

    def receiver(messages, timeout: float) -> None:
        _, out = read_messages(messages, shm_tag(job))
        loc = locate(out["g"])
        assert loc is not None
        memfds.append(os.stat(f"/proc/self/fd/{loc.fd}").st_ino)

    engine.units._push = receiver  # type: ignore[assignment]  # a receiver in place of the gRPC call
    for step in range(3):
        engine.units.push_grads(step, 1, {"g": np.full((1000,), float(step), np.float32)})
    assert len(set(memfds)) == (1 if keeps else 3)
    engine.close()


def test_push_tensors_places_each_units_gradients_in_its_kept_memfd() -> None:
    """The workers' push (transport/rpc.py's push_tensors on a shared-memory plane that keeps memfds):
    step after step the receiver maps the same memfd for a unit, and a different one for another unit."""
    plane = SharedMemoryPlane(TAG, kept_bytes=1 << 20)
    seen: list[tuple[int, int, float]] = []

    def receiver(messages, timeout: float) -> None:  # what a SwarmX node's PushGradients reads
        head, out = read_messages(messages, TAG)
        loc = locate(out["w"])
        assert head is not None and loc is not None
        inode = os.stat(f"/proc/self/fd/{loc.fd}").st_ino  # the memfd itself (fd numbers are reused)
        seen.append((head.unit, inode, float(out["w"][0])))

    for step in range(3):
        for unit in (0, 1):
            g = {"w": np.full((64,), step * 10.0 + unit, np.float32)}
            head = pb.StreamHead(step=step, unit=unit)
            push_tensors("swarmx", receiver, g.items(), head, plane=plane, bf16=False, timeout=5.0)
    memfds = {unit: {ino for u, ino, _ in seen if u == unit} for unit in (0, 1)}
    assert len(memfds[0]) == 1 and len(memfds[1]) == 1 and memfds[0] != memfds[1]
    assert [v for _, _, v in seen] == [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]
    plane.close()
    plane.arena.close()


@pytest.mark.parametrize(("storage", "keeps"), [("memory", True), ("disk", False)])
def test_the_swarmx_root_keeps_a_memfd_per_unit_and_shard_for_its_sums(
    tmp_path: Path, storage: str, keeps: bool
) -> None:
    """With two workers the root SwarmX node sums their gradients and sends the sum to MemoryX: into a
    memfd kept for (unit, shard) over the memory store, a fresh one over the disk store."""
    job = tiny_role_job(tmp_path, "swarmx", memoryx_storage=storage, num_csx=2)
    params = load_params(job.params)
    plan = make_plan(params)
    logic = swarmx_service.build(job)
    assert isinstance(logic.upstream, swarmx_service.MemoryXUpstream)
    assert isinstance(logic.upstream.planes[0], SharedMemoryPlane)
    assert (logic.upstream.planes[0].kept is not None) is keeps
    received: list[tuple[int, float]] = []

    def receiver(messages, timeout: float) -> None:
        _, out = read_messages(messages, shm_tag(job))
        for arr in out.values():
            loc = locate(arr)
            assert loc is not None
            received.append((os.stat(f"/proc/self/fd/{loc.fd}").st_ino, float(arr.reshape(-1)[0])))

    push_through(logic.upstream, [receiver] * plan.num_wgt_servers)  # receivers in place of the gRPC calls
    model = model_def(params)
    name = model.units[1].param_names[0]
    shape = model.specs[name].shape
    for step in range(3):
        for child in range(2):  # the second child's arrival sums and pushes up
            logic.push_grads(step, 1, child, {name: np.full(shape, step + 0.25 * child, np.float32)})
    assert [v for _, v in received] == [0.25, 2.25, 4.25]  # step + (step + 0.25)
    assert len({ino for ino, _ in received}) == (1 if keeps else 3)
    logic.close()

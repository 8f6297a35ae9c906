"""Mappings kept from fetch to fetch (transport/shm_cache.py's MappingCache, the workers' weights on the
shared-memory plane): the same memfd is mapped once, a memfd replaced under the same fd number is mapped
anew, every fetch is still checked (tag and checksum), at most ``capacity`` mappings are kept, and only
workers without a memory budget keep them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.role_jobs import arena_tag, tiny_role_job
from weightstream.transport.errors import ChecksumError, ProtocolError
from weightstream.transport.plane import SharedMemoryPlane
from weightstream.transport.shm import REFERENCES_ONLY, SharedArena, job_tag, locate
from weightstream.transport.shm_cache import MappingCache
from weightstream.transport.tensors import read_messages, tensor_messages
from weightstream.worker import service as worker_service

# roles built here ask peers that do not exist where they run: they answer "this host"
pytestmark = pytest.mark.usefixtures("peers_share_memory")

TAG = job_tag("m" * 64)


def _fetch(
    arrays: dict[str, np.ndarray], cache: MappingCache | None, tag: str = TAG
) -> dict[str, np.ndarray]:
    """What a worker's fetch does: MemoryX's header naming its memfds, read (and checked) here."""
    msgs = list(tensor_messages(arrays.items(), shm=REFERENCES_ONLY))
    return read_messages(msgs, tag, cache)[1]


def test_a_weights_memfd_is_mapped_once_and_shows_the_senders_updates(maps: list[int]) -> None:
    arena = SharedArena(TAG)
    w, b = arena.empty((256, 64)), arena.empty((64,))
    w[...], b[...] = 1.0, 2.0
    cache = MappingCache(8)
    for step in range(4):
        out = _fetch({"w": w, "b": b}, cache)
        np.testing.assert_array_equal(out["w"], np.full((256, 64), 1.0 + step, np.float32))
        np.testing.assert_array_equal(out["b"], np.full((64,), 2.0 + step, np.float32))
        w += 1.0  # MemoryX's update, in place, between fetches
        b += 1.0
    assert len(maps) == 2 and (cache.misses, cache.hits) == (2, 6)
    # without the cache every fetch maps every memfd again
    _fetch({"w": w, "b": b}, None)
    assert len(maps) == 4
    arena.close()


def test_every_fetch_is_still_checked(maps: list[int]) -> None:
    arena = SharedArena(TAG)
    w = arena.empty((128,))
    w[...] = 1.0
    cache = MappingCache(8)
    _fetch({"w": w}, cache)
    msgs = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))
    w[5] = 3.0  # changed after its checksum was taken: the kept mapping shows it, the check catches it
    with pytest.raises(ChecksumError, match="'w'"):
        read_messages(msgs, TAG, cache)
    with pytest.raises(ProtocolError, match="not one of this job's memfds"):
        _fetch({"w": w}, cache, tag=job_tag("another job"))  # the tag is checked on every call
    assert len(maps) == 1
    arena.close()


def test_a_memfd_replaced_under_the_same_fd_number_is_mapped_anew(maps: list[int]) -> None:
    arena = SharedArena(TAG)
    cache = MappingCache(8)
    old = arena.empty((32,))
    old[...] = 1.0
    where = locate(old)
    assert where is not None
    _fetch({"w": old}, cache)
    arena.release(old)  # MemoryX lets go of a weight (a checkpoint loaded, masks made again)
    new = arena.empty((32,))  # the kernel hands out the lowest free fd: the same number
    new[...] = 7.0
    again = locate(new)
    assert again is not None and again.fd == where.fd
    out = _fetch({"w": new}, cache)
    np.testing.assert_array_equal(out["w"], np.full((32,), 7.0, np.float32))
    assert len(maps) == 2 and cache.misses == 2
    arena.close()


def test_at_most_capacity_mappings_are_kept_least_recently_used_out(maps: list[int]) -> None:
    arena = SharedArena(TAG)
    cache = MappingCache(2)
    ws = [arena.empty((16,)) for _ in range(3)]
    for i, w in enumerate(ws):
        w[...] = float(i)
    for w in ws:  # a, b, c: a is pushed out
        _fetch({"w": w}, cache)
    _fetch({"w": ws[2]}, cache)  # kept
    _fetch({"w": ws[1]}, cache)  # kept
    _fetch({"w": ws[0]}, cache)  # mapped again, pushing out c (b was used more recently)
    _fetch({"w": ws[1]}, cache)  # kept
    assert len(maps) == 4 and (cache.misses, cache.hits) == (4, 3)
    arena.close()


@pytest.mark.parametrize(("budget_mb", "keeps"), [(None, True), (64, False)])
def test_workers_keep_weight_mappings_only_without_a_memory_budget(
    tmp_path: Path, budget_mb: int | None, keeps: bool
) -> None:
    """Kept mappings' pages count in the worker's resident memory: a worker with ``worker_memory_mb``
    keeps none, so what it holds stays one unit or two, as the budget assumes."""
    job = tiny_role_job(tmp_path, "worker", worker_memory_mb=budget_mb)
    engine = worker_service.build(job)
    assert isinstance(engine.units, worker_service.SwarmParent)
    assert isinstance(engine.units.plane, SharedMemoryPlane)
    cache = engine.units.plane.maps
    assert (cache is not None) is keeps
    if cache is not None:
        assert cache.capacity >= len(engine.model.specs)  # every weight's memfd stays mapped
    # its fetches (what SwarmX would answer: MemoryX's header naming a memfd of this job)
    arena = SharedArena(arena_tag(job))
    w = arena.empty((64,))
    w[...] = 3.0
    header = list(tensor_messages([("w", w)], shm=REFERENCES_ONLY))
    engine.units._get = lambda request, timeout: iter(header)
    for step in range(3):
        np.testing.assert_array_equal(engine.units.get_unit(step, 1, 0)["w"], w)
    if cache is not None:
        assert (cache.misses, cache.hits) == (1, 2)
    engine.close()
    arena.close()


def test_no_mapping_is_kept_once_the_cache_is_dropped() -> None:
    arena = SharedArena(TAG)
    w = arena.empty((1 << 16,))
    w[...] = 1.0
    cache = MappingCache(4)
    _fetch({"w": w}, cache)
    mapped = _mapped_bytes()
    cache.close()
    assert _mapped_bytes() <= mapped - w.nbytes  # the kept mapping went with the cache
    arena.close()


def _mapped_bytes() -> int:
    """Bytes of this process's memfd mappings (/proc/self/maps)."""
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:weightstream-" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                total += hi - lo
    return total

"""MemoryX keeps the mappings of the memfds gradients arrive in from step to step (memory mode on the
shared-memory plane; memoryx/shard.py's ``grad_maps``): a sender's memfd kept for a unit is mapped once,
not at every push, the update reads what the sender wrote in each step all the same, and a new
configuration drops the kept mappings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.role_jobs import CREDENTIAL, arena_tag, direct_context, tiny_role_job
from weightstream.memoryx import service as memoryx_service
from weightstream.memoryx.shard import MemoryXShard
from weightstream.proto import weightstream_pb2 as pb
from weightstream.role import RoleHost
from weightstream.transport.shm import KeptScratch, SharedArena
from weightstream.transport.tensors import tensor_messages

# roles built here ask peers that do not exist where they run: they answer "this host"
pytestmark = pytest.mark.usefixtures("peers_share_memory")


def _memoryx(tmp_path: Path, **runconfig: Any) -> tuple[RoleHost, MemoryXShard]:
    job = tiny_role_job(tmp_path, "memoryx", **runconfig)
    host = RoleHost("memoryx", memoryx_service.build, CREDENTIAL)
    host.configure(job)
    return host, host.logic(direct_context())


def _step(host: RoleHost, shard: MemoryXShard, kept: KeptScratch, step: int) -> None:
    """What a worker pushes in a step (every unit's gradients of this shard's tensors, each unit's into
    the memfd ``kept`` keeps for it), then the step's update."""
    servicer = memoryx_service.MemoryXServicer(host)
    for unit, spec in enumerate(shard.model.units):
        names = [n for n in spec.param_names if n in shard.names]
        if not names:
            continue
        rng = np.random.default_rng(100 * step + unit)
        grads = {n: rng.standard_normal(shard.model.specs[n].shape).astype(np.float32) for n in names}
        with kept.lease(unit) as scratch:  # the memfd stays open until the call has returned
            messages = list(tensor_messages(grads.items(), pb.StreamHead(step=step, unit=unit), shm=scratch))
            servicer.PushGradients(iter(messages), direct_context())
    shard.grad_sq_sum(step)
    shard.apply_update(step, lr=1e-2, clip_coef=1.0)


def test_a_senders_kept_memfd_is_mapped_once_and_each_steps_gradient_is_read(
    tmp_path: Path, maps: list[int]
) -> None:
    host, shard = _memoryx(tmp_path / "kept")
    # the same job and gradients into a shard that keeps no mapping: its weights are the reference
    ref_host, ref = _memoryx(tmp_path / "ref")
    ref.grad_maps.capacity = 0
    arena = SharedArena(arena_tag(host.job))
    kept = KeptScratch(arena, 1 << 30)
    units = sum(1 for spec in shard.model.units if set(spec.param_names) & set(shard.names))
    for step in range(3):
        _step(host, shard, kept, step)
    assert len(maps) == units  # each unit's memfd once, in the first step
    assert (shard.grad_maps.misses, shard.grad_maps.hits) == (units, 2 * units)
    ref_kept = KeptScratch(arena, 1 << 30)
    for step in range(3):
        _step(ref_host, ref, ref_kept, step)
    assert len(maps) == 4 * units  # without kept mappings every push maps its memfd again
    for n in shard.names:  # the same bits: each step's update read that step's gradients
        np.testing.assert_array_equal(shard.weight(n), ref.weight(n))
    # a new configuration drops the kept mappings: the next pushes map their memfds anew
    shard.reset(generation=0)
    _step(host, shard, kept, 3)
    assert len(maps) == 5 * units
    for h in (host, ref_host):
        h.close()
    kept.close()
    ref_kept.close()
    arena.close()


def test_disk_mode_keeps_no_mapping(tmp_path: Path) -> None:
    """Disk mode's senders keep no gradient memfds (``KEPT_GRADIENT_BYTES``): nothing to keep here."""
    host, shard = _memoryx(tmp_path, memoryx_storage="disk")
    assert shard.grad_maps.capacity == 0
    host.close()

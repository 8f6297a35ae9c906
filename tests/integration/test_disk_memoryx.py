"""Disk-backed MemoryX and the checkpoint options that go with big models, end to end via `weightstream run`:
bitwise the same results as memory mode through a resume, sharded weights-only checkpoints that Hugging Face
loads and that a run refuses to resume from, and a storage directory that is really used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.integration.appliance import metrics, run, write_params


def _files(checkpoint: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(checkpoint.glob("*.safetensors"))}


def _weights(checkpoint: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(checkpoint.glob("model*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.slow  # two trainings, ~13 s; test_appliance's disk-backed-memoryx mode stays in the default run
def test_disk_mode_loads_trains_and_writes_bitwise_as_memory_mode(tmp_path: Path) -> None:
    """Memory mode writes checkpoints at steps 2 and 4; disk mode resumed from the step-2 checkpoint
    (loaded tensor by tensor into its files) writes a step-4 checkpoint with the very same bytes."""
    memory = tmp_path / "memory"
    r = run(write_params(tmp_path, max_steps=4, checkpoint_steps=2), memory, "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    disk = tmp_path / "disk"
    disk.mkdir()
    shutil.copytree(memory / "checkpoint_2", disk / "checkpoint_2")
    params = write_params(tmp_path, max_steps=4, checkpoint_steps=2, memoryx_storage="disk", memoryx_dir="mx")
    r = run(params, disk, "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stdout
    assert _files(disk / "checkpoint_4") == _files(memory / "checkpoint_4")
    assert metrics(disk)[0] == {s: v for s, v in metrics(memory)[0].items() if s > 2}
    assert (disk / "mx").is_dir() and not any((disk / "mx").rglob("*.f32"))  # used, and scratch removed


def test_a_storage_directory_that_cannot_be_made_fails_the_job_and_names_it(tmp_path: Path) -> None:
    """Disk mode that silently kept everything in RAM would train here; it must fail instead."""
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "blocker").write_text("a file where the shards' directory should go")
    params = write_params(tmp_path, max_steps=2, memoryx_storage="disk", memoryx_dir="blocker/inside")
    r = run(params, model_dir, timeout=120)
    assert r.returncode != 0
    assert "runconfig.memoryx_dir: cannot make" in r.stderr and "blocker" in r.stderr
    assert not list(model_dir.glob("checkpoint_*"))


# ~12 s; disk mode bitwise as memory mode stays in the default run
@pytest.mark.slow
def test_weights_only_sharded_checkpoints_load_in_transformers_and_refuse_to_resume(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    full = tmp_path / "full"
    assert run(write_params(tmp_path, max_steps=3), full, "--num_csx", "2").returncode == 0
    small = tmp_path / "small"
    params = write_params(
        tmp_path,
        max_steps=3,
        memoryx_storage="disk",
        checkpoint_optimizer_state=False,
        checkpoint_max_shard_size="20KB",
    )
    r = run(params, small, "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    ckpt = small / "checkpoint_3"
    names = sorted(f.name for f in ckpt.iterdir())
    assert not [n for n in names if n.startswith("optimizer")]
    model_files = [n for n in names if n.startswith("model-")]
    assert len(model_files) >= 4 and all((ckpt / n).stat().st_size <= 20_000 for n in model_files)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == model_files
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["optimizer_state"] is False and "not resumable" in state["note"]
    # the same weights as a run with full checkpoints, and Hugging Face loads the sharded files
    expected = _weights(full / "checkpoint_3")
    got = _weights(ckpt)
    assert got.keys() == expected.keys() and all(np.array_equal(got[n], expected[n]) for n in got)
    model = transformers.GPT2LMHeadModel.from_pretrained(ckpt)
    wte = model.transformer.wte.weight.detach().numpy()
    assert np.array_equal(wte, expected["transformer.wte.weight"])
    # a later run in the same model_dir would resume from it: refused, saying why and what to do
    more = write_params(tmp_path, max_steps=5, checkpoint_optimizer_state=False)
    r = run(more, small)
    assert r.returncode != 0
    assert "weights only" in r.stdout + r.stderr and "autoload_last_checkpoint" in r.stdout + r.stderr

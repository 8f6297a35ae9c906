"""Sparse tensors in a MemoryX shard: masks made from the seed, held compact, kept at zero by the
optimizer, sent as values plus index, and written to (and resumed from) dense checkpoints with masks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.memoryx_shards import tiny_shard, tiny_sparsity
from tests.params_files import TINY
from weightstream.memoryx.shard import MemoryXShard
from weightstream.numerics import ModelDef
from weightstream.numerics.model import init_tensor
from weightstream.numerics.optim import optimizer_step
from weightstream.numerics.sparse_masks import (
    INIT_METHODS,
    InitMethod,
    SparsitySpec,
    kept_count,
    make_positions,
)
from weightstream.params import load_params, model_def, optimizer_config
from weightstream.params.sparsity import model_density, sparsity_specs
from weightstream.transport.sparse import decode_index, split_index

SPARSE = {**TINY, "sparsity": {"sparsity": 0.75, "init_method": "random"}}
C_FC = "transformer.h.0.mlp.c_fc.weight"


def _shard(
    raw: dict[str, Any] = SPARSE, storage: Path | None = None, resume: Path | None = None
) -> tuple[MemoryXShard, ModelDef, dict[str, SparsitySpec]]:
    """``tiny_shard`` of a sparse model, with its tensors' sparsity ({} for a dense model)."""
    shard, model = tiny_shard(raw, timeout_s=2, storage=storage, resume=resume)
    return shard, model, tiny_sparsity(raw, model) or {}


def _positions(shard: MemoryXShard, name: str) -> np.ndarray:
    return shard.sparse.positions(name)


@pytest.mark.parametrize("method", INIT_METHODS)
def test_masks_are_deterministic_and_as_sparse_as_asked(method: InitMethod) -> None:
    spec = SparsitySpec(0.9, method, seed=3)
    w = init_tensor(model_def(load_params(SPARSE)).specs[C_FC], 7)
    a = make_positions(C_FC, w.shape, spec, w)
    assert np.array_equal(a, make_positions(C_FC, w.shape, spec, w.copy()))  # a function of its inputs
    assert np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < w.size
    assert len(a) <= 0.1 * w.size + 1 and len(a) >= 0.1 * w.size - w.shape[0]
    if method == "random":
        other = make_positions(C_FC, w.shape, SparsitySpec(0.9, method, seed=4), w)
        assert not np.array_equal(a, other)  # the seed matters
    if method == "topk":  # every kept magnitude >= every pruned one
        kept = np.zeros(w.size, bool)
        kept[a] = True
        assert np.abs(w.reshape(-1)[kept]).min() >= np.abs(w.reshape(-1)[~kept]).max()
    if method in ("balanced-topk", "checkerboard"):  # every row keeps (about) the same number
        per_row = np.bincount(a // w.shape[1], minlength=w.shape[0])
        assert per_row.max() - per_row.min() <= 1
        if method == "balanced-topk":
            assert (per_row == kept_count(w.shape[1], 0.9)).all()
            kept = np.zeros(w.size, bool)
            kept[a] = True
            mag, keep_rows = np.abs(w), kept.reshape(w.shape)
            for row, keep in zip(mag, keep_rows, strict=True):  # each row keeps its own largest
                assert row[keep].min() >= row[~keep].max()


def test_shard_holds_sparse_tensors_compact_and_sends_values_with_index(storage: Path | None) -> None:
    shard, model, specs = _shard(storage=storage)
    assert set(specs) == set(model.sparse_candidates) and len(specs) == 8  # 4 linear weights x 2 blocks
    names = list(model.specs)
    received, indexes = split_index(dict(shard.tensors(0, names)))
    assert set(received) == set(names) and set(indexes) == set(specs)
    dense = init_tensor(model.specs[C_FC], 7)
    pos = make_positions(C_FC, dense.shape, specs[C_FC], dense)
    kind, data = indexes[C_FC]
    assert np.array_equal(decode_index(C_FC, kind, data, dense.size, len(received[C_FC])), pos)
    assert np.array_equal(received[C_FC], dense.reshape(-1)[pos])  # the kept initial values, exactly
    assert received[C_FC].shape == (kept_count(dense.size, 0.75),)
    assert np.array_equal(
        received["transformer.wte.weight"], init_tensor(model.specs["transformer.wte.weight"], 7)
    )
    with pytest.raises(ValueError, match="shape"):  # a dense gradient for a sparse tensor is refused
        shard.add_gradient(0, 1, {C_FC: np.ones(dense.shape, np.float32)})


def test_pruned_weights_and_their_optimizer_state_stay_zero(rng, storage: Path | None) -> None:
    """Two AdamW steps through the shard equal two dense masked steps (the reference's way) exactly,
    entry by entry: the optimizer is elementwise, so compact storage changes no bit."""
    shard, model, specs = _shard(storage=storage)
    opt = shard.opt
    ref_w = {n: shard.dense(n).copy() for n in model.specs}
    ref_state = {
        n: {k: np.zeros(model.specs[n].shape, np.float32) for k in ("exp_avg", "exp_avg_sq")}
        for n in model.specs
    }
    masks = {n: (shard.dense(n) != 0).astype(np.float32) for n in specs}
    for step in range(2):
        grads: dict[str, np.ndarray] = {}
        for u, unit in enumerate(model.units):
            part = {}
            for n in unit.param_names:
                g = rng.standard_normal(model.specs[n].shape).astype(np.float32)
                if n in specs:
                    g *= masks[n]
                    part[n] = g.reshape(-1)[_positions(shard, n)]
                else:
                    part[n] = g
                grads[n] = grads[n] + g if n in grads else g
            shard.add_gradient(step, u, part)
        shard.grad_sq_sum(step)
        assert shard.apply_update(step, lr=1e-2, clip_coef=1.0)
        for n, g in grads.items():
            optimizer_step(
                opt,
                ref_w[n],
                g,
                ref_state[n],
                step=step + 1,
                lr=1e-2,
                scale=1.0,
                weight_decay=opt.weight_decay_for(n),
            )
    for n in model.specs:
        assert np.array_equal(shard.dense(n), ref_w[n]), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert np.array_equal(shard.dense(f"{n}.{k}"), ref_state[n][k]), (n, k)
    for n in specs:
        pruned = masks[n] == 0
        assert not shard.dense(n)[pruned].any() and not shard.dense(f"{n}.exp_avg_sq")[pruned].any()
        assert shard.dense(f"{n}.exp_avg")[~pruned].any()  # the kept ones did move


def test_checkpoint_is_dense_with_masks_and_resumes_bit_exactly(
    tmp_path: Path, rng, storage: Path | None
) -> None:
    shard, model, specs = _shard(storage=storage)
    for u, unit in enumerate(model.units):
        part = {n: rng.standard_normal(shard.held.shape(n)).astype(np.float32) for n in unit.param_names}
        shard.add_gradient(0, u, part)
    shard.apply_update(0, lr=1e-2, clip_coef=1.0)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = list(model.specs)
    states = [f"{n}.{k}" for n in names for k in ("exp_avg", "exp_avg_sq")]
    shard.write_checkpoint(
        1,
        [(ckpt / "model.safetensors", names)],
        [(ckpt / "optimizer.safetensors", states)],
        [(ckpt / "sparsity_masks.safetensors", list(specs))],
    )
    (ckpt / "trainer_state.json").write_text('{"global_step": 1}')
    weights, masks = load_file(ckpt / "model.safetensors"), load_file(ckpt / "sparsity_masks.safetensors")
    assert set(masks) == set(specs)
    for n in specs:
        assert masks[n].dtype == np.bool_ and masks[n].shape == model.specs[n].shape
        assert weights[n].shape == model.specs[n].shape  # dense, as Hugging Face expects
        assert not weights[n][~masks[n]].any() and np.count_nonzero(masks[n]) == len(_positions(shard, n))
    other, _, _ = _shard(storage=None if storage is None else tmp_path / "other", resume=ckpt)
    assert other.step == 1
    for key in (*names, *states):
        assert np.array_equal(other.dense(key), shard.dense(key)), key
    for n in specs:
        assert np.array_equal(_positions(other, n), _positions(shard, n))
    # the masks come from the checkpoint, not the params: another seed resumes the same masks
    reseeded = {**SPARSE, "sparsity": {**SPARSE["sparsity"], "seed": 99}}
    again, _, _ = _shard(reseeded, resume=ckpt)
    assert np.array_equal(_positions(again, C_FC), _positions(shard, C_FC))


def test_a_dense_checkpoint_made_sparse_with_topk_keeps_its_largest_weights(tmp_path: Path) -> None:
    dense_shard, model, _ = _shard(TINY)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = list(model.specs)
    states = [f"{n}.{k}" for n in names for k in ("exp_avg", "exp_avg_sq")]
    dense_shard.write_checkpoint(
        0, [(ckpt / "model.safetensors", names)], [(ckpt / "optimizer.safetensors", states)]
    )
    (ckpt / "trainer_state.json").write_text('{"global_step": 0}')
    topk = {**TINY, "sparsity": {"sparsity": 0.5, "init_method": "topk"}}
    shard, _, _ = _shard(topk, resume=ckpt)
    w = dense_shard.weight(C_FC)
    kept = shard.dense(C_FC) != 0
    assert kept.sum() == kept_count(w.size, 0.5)
    assert np.abs(w[kept]).min() >= np.abs(w[~kept]).max()


def test_kept_count_never_keeps_more_than_the_level_allows() -> None:
    assert kept_count(1000, 0.9) == 100  # 0.9 as written, not the float just below it
    assert kept_count(65536, 0.9) == 6553  # 58982.4 zeros: rounded up, so at most 10% kept
    assert kept_count(10, 0.0) == 10 and kept_count(3, 0.999) == 0


def test_checkerboard_shifts_each_row_so_kept_entries_never_line_up_in_columns() -> None:
    w = np.ones((8, 8), np.float32)
    a = make_positions("w", (8, 8), SparsitySpec(0.75, "checkerboard"), w)  # every 4th entry
    assert np.array_equal(np.bincount(a // 8, minlength=8), [2] * 8)  # two per row
    assert np.array_equal(np.bincount(a % 8, minlength=8), [2] * 8)  # and two per column, not 8 in two


@pytest.mark.parametrize("bare", [False, True])
def test_a_shard_starts_from_a_hugging_face_directory_and_masks_those_weights(
    tmp_path: Path, rng, storage: Path | None, bare: bool
) -> None:
    """The weights come from the directory tensor by tensor (a GPT2Model-style file without the
    ``transformer.`` prefix too; buffers and a tied head's copy passed over), topk masks rank *them*, and
    the optimizer state starts at zero."""
    model = model_def(load_params(TINY))
    theirs = {n: rng.standard_normal(s.shape).astype(np.float32) for n, s in model.specs.items()}
    stored = {(n.removeprefix("transformer.") if bare else n): w for n, w in theirs.items()}
    stored["transformer.h.0.attn.bias" if not bare else "h.0.attn.bias"] = np.ones((1, 1, 16, 16), np.float32)
    stored["lm_head.weight"] = theirs["transformer.wte.weight"]
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file(stored, hf / "model.safetensors")
    raw = {**TINY, "sparsity": {"sparsity": 0.5, "init_method": "topk"}}
    p = load_params(raw)
    specs = sparsity_specs(p, model)
    shard = MemoryXShard(
        model,
        optimizer_config(p.optimizer),
        list(model.specs),
        7,
        2,
        storage_dir=storage,
        sparsity=specs,
        init_dir=str(hf),
    )
    for n, w in theirs.items():
        if n in specs:
            keep = np.zeros(w.size, bool)
            keep[make_positions(n, w.shape, specs[n], w)] = True
            assert np.array_equal(shard.dense(n), np.where(keep.reshape(w.shape), w, 0)), n
        else:
            assert np.array_equal(shard.dense(n), w), n
        assert not shard.dense(f"{n}.exp_avg").any() and shard.step == 0


@pytest.mark.parametrize("method", INIT_METHODS)
def test_the_reported_density_is_that_of_the_masks_made(method: str) -> None:
    """What wsctl and REST show (model_density) counts exactly the entries the masks keep."""
    p = load_params({**TINY, "sparsity": {"sparsity": 0.7, "init_method": method}})
    model = model_def(p)
    kept = 0
    for n, spec in model.specs.items():
        sparse = sparsity_specs(p, model).get(n)
        w = init_tensor(spec, 7)
        kept += len(make_positions(n, spec.shape, sparse, w)) if sparse else spec.numel
    assert model_density(p, model) == pytest.approx(kept / model.num_params, abs=1e-12)


@pytest.mark.parametrize("method", ["topk", "balanced-topk"])
def test_magnitude_ties_keep_the_lower_positions(rng, method: InitMethod) -> None:
    """Ties in magnitude (a checkpoint of rounded weights; here three magnitudes, either sign) go to the
    lower position, as the module documents, so the mask never depends on the sort algorithm."""
    w = (rng.integers(1, 4, (16, 40)) * rng.choice([-1, 1], (16, 40))).astype(np.float32)
    a = make_positions("w", w.shape, SparsitySpec(0.75, method), w)
    pos = np.arange(w.size).reshape(w.shape)
    if method == "topk":  # by magnitude, descending, then by position
        want = np.lexsort((pos.reshape(-1), -np.abs(w).reshape(-1)))[: kept_count(w.size, 0.75)]
    else:  # the same within each row
        per_row = kept_count(40, 0.75)
        want = np.concatenate([p[np.lexsort((p, -np.abs(r)))[:per_row]] for r, p in zip(w, pos, strict=True)])
    assert np.array_equal(a, np.sort(want))


def _write_masks_in_two_files(
    shard: MemoryXShard, model: ModelDef, specs: dict[str, SparsitySpec], ckpt: Path
) -> None:
    """A checkpoint whose masks span two files under Hugging Face's shard names, as a run with two
    MemoryX shards (or a small ``checkpoint_max_shard_size``) writes them."""
    names = list(model.specs)
    states = [f"{n}.{k}" for n in names for k in ("exp_avg", "exp_avg_sq")]
    sparse = list(specs)
    shard.write_checkpoint(
        0,
        [(ckpt / "model.safetensors", names)],
        [(ckpt / "optimizer.safetensors", states)],
        [
            (ckpt / "sparsity_masks-00001-of-00002.safetensors", sparse[:3]),
            (ckpt / "sparsity_masks-00002-of-00002.safetensors", sparse[3:]),
        ],
    )
    (ckpt / "trainer_state.json").write_text('{"global_step": 0}')


def test_masks_in_several_checkpoint_files_are_all_loaded_on_resume(tmp_path: Path) -> None:
    """Every ``sparsity_masks*.safetensors`` file is read: another seed resumes the saved masks of the
    tensors in either file, not masks made anew."""
    shard, model, specs = _shard()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _write_masks_in_two_files(shard, model, specs, ckpt)
    reseeded = {**SPARSE, "sparsity": {**SPARSE["sparsity"], "seed": 99}}
    again, _, _ = _shard(reseeded, resume=ckpt)
    for n in specs:
        assert np.array_equal(_positions(again, n), _positions(shard, n)), n


def test_a_checkpoint_mask_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    shard, model, specs = _shard()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _write_masks_in_two_files(shard, model, specs, ckpt)
    masks = load_file(ckpt / "sparsity_masks-00001-of-00002.safetensors")
    masks[C_FC] = masks[C_FC].T.copy()  # the same entries count, transposed: [64, 32] for [32, 64]
    save_file(masks, ckpt / "sparsity_masks-00001-of-00002.safetensors")
    with pytest.raises(ValueError, match=r"mask of 'transformer\.h\.0\.mlp\.c_fc\.weight' has shape"):
        _shard(resume=ckpt)

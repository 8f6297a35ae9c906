"""How the ``sparsity:`` block resolves per tensor (params/sparsity.py): the masks' seed, and levels of 0."""

from __future__ import annotations

from typing import Any

from tests.params_files import TINY
from weightstream.numerics.sparse_masks import SparsitySpec
from weightstream.params import load_params, model_def
from weightstream.params.sparsity import model_density, sparsity_specs


def _specs(sparsity: dict[str, Any], seed: int = 7) -> dict[str, SparsitySpec]:
    p = load_params({**TINY, "runconfig": {**TINY["runconfig"], "seed": seed}, "sparsity": sparsity})
    return sparsity_specs(p, model_def(p))


def test_the_masks_seed_is_sparsity_seed_else_runconfig_seed() -> None:
    assert {s.seed for s in _specs({"sparsity": 0.5}, seed=7).values()} == {7}
    assert {s.seed for s in _specs({"sparsity": 0.5, "seed": 11}, seed=7).values()} == {11}
    assert {s.seed for s in _specs({"sparsity": 0.5, "seed": 0}, seed=7).values()} == {0}  # 0 is a seed


def test_a_level_of_zero_leaves_its_tensors_dense() -> None:
    """A glob mapped to 0.0 takes its tensors out of the sparse set (no mask, no index on the wire),
    and still wins over later globs; a plain 0.0 makes the whole model dense."""
    specs = _specs({"sparsity": {"*.mlp.*": 0.0, "*.weight": 0.5}})
    assert sorted(specs) == [
        f"transformer.h.{i}.attn.{k}.weight" for i in (0, 1) for k in ("c_attn", "c_proj")
    ]
    p = load_params({**TINY, "sparsity": {"sparsity": 0.0}})
    assert sparsity_specs(p, model_def(p)) == {} and model_density(p, model_def(p)) == 1.0

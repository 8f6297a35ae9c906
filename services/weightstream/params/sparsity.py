"""The ``sparsity:`` block resolved against the model: which tensors are sparse, and how.

Eligible tensors are the 2-D weights of linear layers (``ModelDef.sparse_candidates``): the embeddings
and the LM head are looked up or tied, not multiplied by the sparse kernels, and norms and biases are 1-D.
``param_filter`` globs (``fnmatch``, over the Hugging Face tensor names) narrow that set (a glob may also
hit biases and norms, which stay dense); a glob that matches no eligible tensor is an error naming it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from weightstream.numerics import ModelDef
from weightstream.numerics.sparse_masks import SparsitySpec, kept_entries
from weightstream.params.errors import Problem
from weightstream.params.schema import Params

__all__ = ["SPARSE_FAMILIES", "model_density", "sparsity_problems", "sparsity_specs"]

# the models whose units multiply their linear weights through ``matmul_any``/``weight_grad``
SPARSE_FAMILIES = ("gpt2", "llama", "fc_mlp")


def sparsity_specs(p: Params, model: ModelDef) -> dict[str, SparsitySpec]:
    """{tensor: its SparsitySpec} for every sparse tensor (empty without a sparsity block). Assumes the
    params passed ``sparsity_problems``."""
    specs, _ = _resolve(p, model)
    return specs


def sparsity_problems(p: Params, model: ModelDef) -> list[Problem]:
    return _resolve(p, model)[1]


def _resolve(p: Params, model: ModelDef) -> tuple[dict[str, SparsitySpec], list[Problem]]:
    sp = p.sparsity
    if sp is None:
        return {}, []
    problems: list[Problem] = []
    if model.family not in SPARSE_FAMILIES:
        problems.append(
            Problem(
                "sparsity", f"is implemented for model.name {' and '.join(SPARSE_FAMILIES)}", model.family
            )
        )
        return {}, problems
    candidates = model.sparse_candidates
    seed = sp.seed if sp.seed is not None else p.runconfig.seed
    if sp.param_filter is None:
        chosen = list(candidates)
    else:
        globs = [sp.param_filter] if isinstance(sp.param_filter, str) else sp.param_filter
        chosen = []
        for i, glob in enumerate(globs):
            path = "sparsity.param_filter" + ("" if isinstance(sp.param_filter, str) else f"[{i}]")
            hits = [n for n in model.specs if fnmatchcase(n, glob)]
            eligible = [n for n in hits if n in candidates]
            if hits and not eligible:
                problems.append(
                    Problem(
                        path,
                        f"matches only tensors that cannot be sparse ({hits[0]!r}...): only the 2-D weights "
                        "of linear layers can (not embeddings, the LM head, norms or biases)",
                        glob,
                    )
                )
            elif not hits:
                problems.append(Problem(path, "matches no tensor of this model", glob))
            chosen += [n for n in eligible if n not in chosen]  # biases and norms a glob also hits: dense
    specs: dict[str, SparsitySpec] = {}
    if isinstance(sp.sparsity, float):
        levels = dict.fromkeys(chosen, sp.sparsity)
    else:
        levels = {}
        for glob, level in sp.sparsity.items():
            hits = [n for n in chosen if fnmatchcase(n, glob)]
            if not hits:
                problems.append(
                    Problem(f"sparsity.sparsity[{glob!r}]", "matches no tensor param_filter selects", level)
                )
            for n in hits:
                levels.setdefault(n, level)  # the first glob that matches wins
    for n in model.specs:  # the model's tensor order
        if n in levels and levels[n] > 0.0:
            specs[n] = SparsitySpec(levels[n], sp.init_method, seed)
    return specs, problems


def model_density(p: Params, model: ModelDef) -> float:
    """Non-zero weights over all weights, as the masks will make them (1.0 for a dense model)."""
    pruned = sum(
        model.specs[n].numel - kept_entries(model.specs[n].shape, s)
        for n, s in sparsity_specs(p, model).items()
    )
    return 1.0 - pruned / model.num_params

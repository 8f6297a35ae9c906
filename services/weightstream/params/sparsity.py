"""The ``sparsity:`` block resolved against the model: which tensors are sparse, and how.

Eligible tensors are the 2-D weights of linear layers (``ModelDef.sparse_candidates``): the embeddings
and the LM head are looked up or tied, not multiplied by the sparse kernels, and norms and biases are 1-D.
``param_filter`` globs (``fnmatch``, case-sensitive, whole name) narrow that set; so do the globs of a
per-glob ``sparsity`` mapping. A glob selects a tensor when it matches the tensor's Hugging Face name or
its ModelZoo name(s) (``modelzoo_names``: ModelZoo's own params files say ``*proj_[qkv]_dense_layer.weight``
or ``*linear_layer.weight``). A glob may also hit biases and norms, which stay dense; a glob that matches no
eligible tensor is an error naming it, and so is one that matches some but not all of the ModelZoo
parameters one of our tensors holds (GPT-2's fused q/k/v ``c_attn``): we cannot make a third of it sparse.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import NamedTuple, cast

from weightstream.numerics import ModelDef
from weightstream.numerics.sparse_masks import SparsitySpec, kept_entries
from weightstream.numerics.sparsity_schedule import LevelSchedule, UpdateSchedule
from weightstream.params.errors import Problem
from weightstream.params.modelzoo_names import fused_why, modelzoo_names
from weightstream.params.schema import Params
from weightstream.params.sparsity_schema import LevelScheduleParams, ScheduleParams, SparsityParams

__all__ = [
    "SPARSE_FAMILIES",
    "filter_selection",
    "final_kept",
    "model_density",
    "sparsity_problems",
    "sparsity_specs",
]

# the models whose units multiply their linear weights through ``matmul_any``/``weight_grad``
SPARSE_FAMILIES = ("gpt2", "llama", "fc_mlp")


def sparsity_specs(p: Params, model: ModelDef) -> dict[str, SparsitySpec]:
    """{tensor: its SparsitySpec} for every sparse tensor (empty without a sparsity block). Assumes the
    params passed ``sparsity_problems``."""
    return _resolve(p, model).specs


def sparsity_problems(p: Params, model: ModelDef) -> list[Problem]:
    return _resolve(p, model).problems


def filter_selection(p: Params, model: ModelDef) -> list[tuple[str, list[str]]]:
    """Each ``param_filter`` glob, in the file's order, with the eligible tensors it selects (our names, in
    the model's order; a tensor two globs select is listed under both). Empty without a sparsity block or
    without ``param_filter`` (then every eligible tensor is selected: ``model.sparse_candidates``)."""
    return _resolve(p, model).selection


class _Resolved(NamedTuple):
    specs: dict[str, SparsitySpec]
    problems: list[Problem]
    selection: list[tuple[str, list[str]]]


class _Hits(NamedTuple):
    tensors: list[str]  # the tensors the glob selects, eligible or not
    partial: Problem | None  # the first eligible tensor it selects part of, as a problem


def _glob_hits(
    path: str, glob: str, names: Iterable[str], mz: dict[str, tuple[str, ...]], eligible: set[str]
) -> _Hits:
    """The tensors among ``names`` that ``glob`` selects by their Hugging Face or ModelZoo names."""
    tensors: list[str] = []
    partial: Problem | None = None
    for n in names:
        if fnmatchcase(n, glob):
            tensors.append(n)
            continue
        theirs = mz.get(n, ())
        matched = [m for m in theirs if fnmatchcase(m, glob)]
        if not matched:
            continue
        if len(matched) == len(theirs) or n not in eligible:
            tensors.append(n)  # a bias it selects a third of stays dense either way
        elif partial is None:
            missed = [m for m in theirs if m not in matched]
            partial = Problem(
                path,
                f"selects ModelZoo's {_short(matched)} but not {_short(missed)}, which {n!r} also holds: "
                + fused_why(n),
                glob,
            )
    return _Hits(tensors, partial)


def _short(names: list[str]) -> str:
    """The last two parts of ModelZoo names (``...self_attn.proj_q_dense_layer.weight`` ->
    ``proj_q_dense_layer.weight``), comma-separated."""
    return ", ".join(".".join(n.split(".")[-2:]) for n in names)


def _resolve(p: Params, model: ModelDef) -> _Resolved:
    sp = p.sparsity
    if sp is None:
        return _Resolved({}, [], [])
    problems: list[Problem] = []
    if model.family not in SPARSE_FAMILIES:
        problems.append(
            Problem(
                "sparsity", f"is implemented for model.name {' and '.join(SPARSE_FAMILIES)}", model.family
            )
        )
        return _Resolved({}, problems, [])
    candidates = model.sparse_candidates
    eligible = set(candidates)
    mz = modelzoo_names(model)
    seed = sp.seed if sp.seed is not None else p.runconfig.seed
    selection: list[tuple[str, list[str]]] = []
    if sp.param_filter is None:
        chosen = list(candidates)
    else:
        globs = [sp.param_filter] if isinstance(sp.param_filter, str) else sp.param_filter
        chosen = []
        for i, glob in enumerate(globs):
            path = "sparsity.param_filter" + ("" if isinstance(sp.param_filter, str) else f"[{i}]")
            hits = _glob_hits(path, glob, model.specs, mz, eligible)
            selected = [n for n in hits.tensors if n in eligible]
            if hits.partial is not None:
                problems.append(hits.partial)
            elif hits.tensors and not selected:
                problems.append(
                    Problem(
                        path,
                        f"matches only tensors that cannot be sparse ({hits.tensors[0]!r}...): only the 2-D "
                        "weights of linear layers can (not embeddings, the LM head, norms or biases)",
                        glob,
                    )
                )
            elif not hits.tensors:
                problems.append(Problem(path, "matches no tensor of this model", glob))
            selection.append((glob, selected))
            chosen += [n for n in selected if n not in chosen]  # biases and norms a glob also hits: dense
    specs: dict[str, SparsitySpec] = {}
    # validated: a float or a schedule (no _RefusedLevel: its validator always raises), or those per glob
    given = cast("float | ScheduleParams | dict[str, float | ScheduleParams]", sp.sparsity)
    levels: dict[str, float | ScheduleParams]
    if not isinstance(given, dict):
        levels = dict.fromkeys(chosen, given)
    else:
        levels = {}
        for glob, written in given.items():
            path = f"sparsity.sparsity[{glob!r}]"
            hits = _glob_hits(path, glob, chosen, mz, eligible)
            if hits.partial is not None:
                problems.append(hits.partial)
            elif not hits.tensors:
                problems.append(Problem(path, "matches no tensor param_filter selects", written))
            for n in hits.tensors:
                levels.setdefault(n, written)  # the first glob that matches wins
    dynamic: dict[int, SparsitySpec] = {}  # one spec (and one check) per level schedule the file writes
    for n in model.specs:  # the model's tensor order
        level = levels.get(n)
        if isinstance(level, LevelScheduleParams):
            if id(level) not in dynamic:
                spec = dynamic[id(level)] = _dynamic_spec(level, sp, seed)
                bad = _nan_step(spec.schedule, spec.update, p.runconfig.max_steps)
                if bad is not None:
                    problems.append(Problem("sparsity.sparsity", bad, level.model_dump()))
            specs[n] = dynamic[id(level)]
        elif level is not None and level > 0.0:
            specs[n] = SparsitySpec(level, sp.init_method, seed)
    return _Resolved(specs, problems, selection)


@functools.lru_cache(maxsize=16)
def _nan_step(schedule: LevelSchedule | None, update: UpdateSchedule | None, max_steps: int) -> str | None:
    """Why a level schedule cannot run (a NaN at one of the run's update steps), found before it starts."""
    assert schedule is not None and update is not None
    chunk = 1 << 20  # steps at a time: a run of 10^9 steps is checked in bounded memory
    try:
        for first in range(0, max_steps + 1, chunk):
            schedule.levels(update.update_steps(min(first + chunk - 1, max_steps), first))
    except ValueError as e:
        return str(e)
    return None


def _dynamic_spec(level: ScheduleParams, sp: SparsityParams, seed: int) -> SparsitySpec:
    """gmp: the level schedule and the update steps (default: after every step, and at the start, so the
    run starts sparse at the schedule's level at step 0; with a later start it starts dense)."""
    schedule = LevelSchedule(level.type, **level.model_dump(exclude={"type"}))
    u = sp.update
    update = (
        UpdateSchedule()
        if u is None
        else UpdateSchedule(
            u.freq or 1, u.start or 0, u.stop, tuple(u.steps) if u.steps is not None else None
        )
    )
    start = float(schedule.at(0)) if update.is_update(0) else 0.0
    return SparsitySpec(start, sp.init_method, seed, schedule, update)


def final_kept(shape: tuple[int, ...], spec: SparsitySpec, max_steps: int) -> int:
    """Entries a tensor keeps at the end of a run of ``max_steps``: a gmp mask's at its last update."""
    last = spec.update.last_update(max_steps) if spec.update is not None else None
    if last is None or last == 0:
        return kept_entries(shape, spec)
    return spec.kept_at(math.prod(shape), last)


def model_density(p: Params, model: ModelDef) -> float:
    """Non-zero weights over all weights, as the masks will make them (1.0 for a dense model; with gmp, as
    the run ends)."""
    steps = p.runconfig.max_steps
    pruned = sum(
        model.specs[n].numel - final_kept(model.specs[n].shape, s, steps)
        for n, s in sparsity_specs(p, model).items()
    )
    return 1.0 - pruned / model.num_params

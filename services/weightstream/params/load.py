"""Read, validate and resolve a params file. Nothing is scheduled before this has passed.

``load_params`` collects *every* problem (unsupported ModelZoo keys, pydantic's per-key errors, then
checks across sections) and raises one ``ParamsError`` listing them, each with its key path.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from weightstream.params.checks import cross_check
from weightstream.params.errors import ParamsError, Problem
from weightstream.params.key_report import key_report
from weightstream.params.layout import KeyUse, Origin, relocate
from weightstream.params.modelzoo import UNSUPPORTED
from weightstream.params.not_applicable import NOT_APPLICABLE
from weightstream.params.resolve import dump_params, model_def, optimizer_config
from weightstream.params.schema import (
    FCMLPModelParams,
    GPT2ModelParams,
    InputParams,
    LlamaModelParams,
    OptimizerParams,
    Params,
    RunConfig,
    SchedulePieceParams,
    SparsityParams,
)
from weightstream.params.sparsity_schema import LEVEL_TAGS, LEVEL_TYPES, UpdateParams
from weightstream.params.text import parse_params, read_params_text
from weightstream.params.trainer_layout import from_trainer

__all__ = [
    "READ_FIRST",
    "UNSUPPORTED",
    "Loaded",
    "dump_params",
    "load_params",
    "model_def",
    "optimizer_config",
    "parse_params",
    "read_params",
    "read_params_text",
]

Resolve = Callable[[Params], tuple[Params, list[Problem]]]
_MODELS: dict[str, type[BaseModel]] = {
    "gpt2": GPT2ModelParams,
    "gpt3": GPT2ModelParams,
    "llama": LlamaModelParams,
    "fc_mlp": FCMLPModelParams,
}
_MODEL_NAMES = ", ".join(repr(n) for n in _MODELS)


@dataclass(frozen=True)
class Loaded:
    """A validated params file, the key report, and where each canonical key was written."""

    params: Params
    report: list[KeyUse]
    origin: Origin


def load_params(
    params: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> Params:
    """Validate a params file (a path, or an already parsed mapping) in either layout; ``overrides``
    replace keys of ``runconfig`` (the CLI's ``--num_csx`` and friends). Raises ``ParamsError`` listing
    every problem, each at the key path the user wrote."""
    return read_params(params, overrides, source).params


def read_params(
    params: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    source: str | None = None,
    override_label: str = "--{}",
    resolve: Resolve | None = None,
) -> Loaded:
    """``load_params``, with the key report (``key_report.py``) and the origin map. An override is named
    ``override_label.format(key)`` in problems and the report (a command-line flag by default).
    ``resolve`` (the checks a local run makes of what the keys name: ``jobs/admission.py``) takes
    the validated params and returns them completed, with its problems; they are reported with the
    file's own, at the key paths the user wrote."""
    if isinstance(params, str | Path):
        source = source or str(params)
        raw = parse_params(read_params_text(params), source)
    else:
        raw = copy.deepcopy(dict(params))
    source = source or "params"
    written = copy.deepcopy(raw)
    origin, reported, problems, also = Origin(), [], [], {}
    if "trainer" in raw:
        t = from_trainer(raw)
        raw, origin, reported, problems, also = t.legacy, t.origin, t.uses, t.problems, t.also
    overrides = dict(overrides or {})
    if overrides:
        rc = raw.get("runconfig")
        raw["runconfig"] = {**(rc if isinstance(rc, dict) else {}), **overrides}
        for key in overrides:
            origin.add(f"runconfig.{key}", override_label.format(key))

    for read_first in READ_FIRST.values():
        problems += read_first(raw, origin, reported)
    problems += _not_applicable(raw, origin, reported) + _unsupported(raw)
    try:
        parsed = Params.model_validate(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        problems += [_translate(err, raw) for err in errors]
        # Also run the later checks where possible (without the failing keys, which then take their
        # defaults or a stand-in), so one run reports as much as it can instead of one problem per
        # attempt; a problem that names a failing key would speak of its stand-in, so it is left out.
        stand_in = _with_stand_ins(raw, [list(err["loc"]) for err in errors])
        if stand_in is not None:
            failing = [_user_loc(err["loc"]) for err in errors]
            seen = {q.path for q in problems}
            later = cross_check(stand_in) + (resolve(stand_in)[1] if resolve else [])
            problems += [q for q in later if q.path not in seen and not _names_any(q, failing)]
        raise ParamsError(relocate(problems, origin), source) from None
    problems += cross_check(parsed)
    if resolve is not None:  # what the keys name (files, sizes, checkpoints): reported with the rest
        parsed, more = resolve(parsed)
        seen = {q.path for q in problems}
        problems += [q for q in more if q.path not in seen]
    if problems:
        raise ParamsError(relocate(problems, origin), source)
    return Loaded(parsed, key_report(raw, origin, reported, written, overrides, also), origin)


_STAND_INS: tuple[Any, ...] = (1, 1.0, True, "SyntheticDataProcessor", "x", [], {})


def _with_stand_ins(raw: dict[str, Any], locs: list[list[Any]]) -> Params | None:
    """``raw`` validated without the keys at ``locs``: an optional key takes its default, a required one
    the first stand-in value its type accepts. None when that still does not validate."""
    out = _without(raw, locs)
    removed = [_user_loc(loc) for loc in locs]
    for _ in range(len(removed) + 1):
        try:
            return Params.model_validate(out)
        except ValidationError as e:
            errors = e.errors(include_url=False)
            missing = [_user_loc(x["loc"]) for x in errors if x["type"] == "missing"]
            if len(missing) != len(errors) or any(loc not in removed for loc in missing):
                return None
            for loc in missing:
                _set(out, loc, _stand_in(out, loc))
    return None


def _stand_in(raw: dict[str, Any], loc: list[Any]) -> Any:
    for value in _STAND_INS:
        trial = copy.deepcopy(raw)
        _set(trial, loc, value)
        try:
            Params.model_validate(trial)
            return value
        except ValidationError as e:
            if all(_user_loc(x["loc"])[: len(loc)] != loc for x in e.errors(include_url=False)):
                return value
    return None


def _set(raw: dict[str, Any], loc: list[Any], value: Any) -> None:
    node: Any = raw
    for key in loc[:-1]:
        node = node[key]
    node[loc[-1]] = value


def _names_any(problem: Problem, locs: list[list[Any]]) -> bool:
    """Whether ``problem`` is at, or its message speaks of, one of the keys at ``locs``."""
    for loc in locs:
        path, leaf = _path(loc), str(loc[-1]) if loc else ""
        if problem.path == path or (leaf and re.search(rf"\b{re.escape(leaf)}\b", problem.message)):
            return True
    return False


def _mixed_precision(raw: dict[str, Any], origin: Origin, reported: list[KeyUse]) -> list[Problem]:
    """ModelZoo's switch (legacy ``model.mixed_precision``, ``trainer.init.precision.enabled``): off, the
    whole run is fp32 whatever ``fp16_type`` says; on, ``fp16_type`` applies."""
    model = raw.get("model")
    if not isinstance(model, dict) or "mixed_precision" not in model:
        return []
    enabled = model["mixed_precision"]
    raw["model"] = model = {k: v for k, v in model.items() if k != "mixed_precision"}
    if not isinstance(enabled, bool):
        return [Problem("model.mixed_precision", "must be true or false", enabled)]
    note = "mixed precision as fp16_type says" if enabled else "fp32 throughout"
    reported.append(KeyUse(origin("model.mixed_precision"), enabled, "used", note))
    if not enabled and "fp16_type" in model:
        reported.append(
            KeyUse(origin("model.fp16_type"), model["fp16_type"], "not applicable", "mixed precision is off")
        )
        raw["model"] = {k: v for k, v in model.items() if k != "fp16_type"}
    return []


def _load_states(raw: dict[str, Any], origin: Origin, reported: list[KeyUse]) -> list[Problem]:
    """ModelZoo's ``load_checkpoint_states`` (``LoadCheckpointStates``): which states of the starting
    checkpoint to load. A Hugging Face directory holds the model's weights only, so ``model`` is what
    loads; optimizer state and step start fresh. A weightstream run resumes fully from its own model_dir."""
    rc = raw.get("runconfig")
    if not isinstance(rc, dict) or "load_checkpoint_states" not in rc:
        return []
    value = rc["load_checkpoint_states"]
    raw["runconfig"] = {k: v for k, v in rc.items() if k != "load_checkpoint_states"}
    states = [s.strip() for s in value.split(",")] if isinstance(value, str) else value
    if states != ["model"]:
        why = (
            "only 'model' is supported: checkpoint_path names a Hugging Face directory, which holds the "
            "model's weights; a weightstream run resumes fully (optimizer, step, data) from its own model_dir"
        )
        return [Problem("runconfig.load_checkpoint_states", why, value)]
    note = "the weights load from checkpoint_path; optimizer state and step start fresh"
    reported.append(KeyUse(origin("runconfig.load_checkpoint_states"), value, "used", note))
    return []


# keys read, and taken out of the file, before the models validate it (each function's docstring says how)
READ_FIRST: dict[str, Callable[[dict[str, Any], Origin, list[KeyUse]], list[Problem]]] = {
    "model.mixed_precision": _mixed_precision,
    "runconfig.load_checkpoint_states": _load_states,
}


def _not_applicable(raw: dict[str, Any], origin: Origin, reported: list[KeyUse]) -> list[Problem]:
    """Take out the keys that change nothing here (reporting them), and refuse those whose value would."""
    problems = []
    for section, rules in NOT_APPLICABLE.items():
        d = raw.get(section)
        if not isinstance(d, dict):
            continue
        for key in [k for k in d if k in rules]:
            path, rule = f"{section}.{key}", rules[key]
            if rule.harmless(d[key]):
                reported.append(KeyUse(origin(path), d[key], "not applicable", rule.reason))
            else:
                problems.append(Problem(path, f"cannot be honoured: {rule.reason}", d[key]))
            raw[section] = d = {k: v for k, v in d.items() if k != key}
    return problems


def _without(raw: dict[str, Any], locs: list[list[Any]]) -> dict[str, Any]:
    """A deep copy of ``raw`` with the keys at ``locs`` removed (those that exist)."""
    out = copy.deepcopy(raw)
    for loc in map(_user_loc, locs):
        node: Any = out
        for key in loc[:-1]:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                break
        else:
            if isinstance(node, dict) and loc and loc[-1] in node:
                del node[loc[-1]]
    return out


def _unsupported(raw: dict[str, Any]) -> list[Problem]:
    """Pull out known-but-unimplemented keys (so pydantic does not also call them unknown)."""
    problems = []
    for section, keys in UNSUPPORTED.items():
        d = raw if section == "" else raw.get(section)
        if not isinstance(d, dict):
            continue
        # a model key one family does not implement may be another's own (rope_theta is llama's)
        own: set[str] = set()
        if section == "model":  # without a (known) name, the name is the problem, not keys some family has
            families = [_MODELS[d["name"]]] if d.get("name") in _MODELS else list(_MODELS.values())
            own = {key for family in families for key in family.model_fields}
        for key in [k for k in d if k in keys and k not in own]:
            path = f"{section}.{key}" if section else key
            problems.append(
                Problem(
                    path, f"is a ModelZoo key weightstream does not implement: {keys[key]}; remove it", d[key]
                )
            )
            if section:
                raw[section] = d = {k: v for k, v in d.items() if k != key}
            else:
                del raw[key]
    return problems


def _user_loc(loc: Any) -> list[Any]:
    """pydantic's error location as the user's key path: the model union's tag is not a key they wrote."""
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "model" and parts[1] in _MODELS:
        del parts[1]
    if parts[:1] == ["sparsity"]:  # the level's form: a tag of the union, not a key
        parts = [part for part in parts if part not in LEVEL_TAGS]
    return parts


def _path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<file>"


def _user_path(loc: list[Any], raw: dict[str, Any]) -> str:
    """``_path``, with the glob of a per-glob ``sparsity`` mapping quoted as params/sparsity.py names it
    (``sparsity.sparsity['*.mlp.*'].slope``)."""
    section = raw.get("sparsity")
    levels = None
    if (
        isinstance(section, dict)
        and len(loc) > 2
        and loc[:2] in (["sparsity", "sparsity"], ["sparsity", "schedule"])
    ):
        levels = section.get(loc[1])
    if isinstance(levels, dict) and "type" not in levels:
        return _path(loc[:2]) + f"[{loc[2]!r}]" + "".join(f".{x}" for x in loc[3:])
    return _path(loc)


def _section_class(loc: list[Any], raw: dict[str, Any]) -> type[BaseModel] | None:
    if not loc:
        return Params
    if loc[0] in ("train_input", "eval_input") and len(loc) == 1:
        return InputParams
    if loc == ["model"]:
        name = raw.get("model", {}).get("name") if isinstance(raw.get("model"), dict) else None
        return _MODELS.get(name) if isinstance(name, str) else None
    if loc == ["optimizer"]:
        return OptimizerParams
    if loc[:2] == ["optimizer", "learning_rate"] and len(loc) == 3:
        return SchedulePieceParams
    if loc == ["sparsity"]:
        return SparsityParams
    if loc == ["sparsity", "update"]:
        return UpdateParams
    if loc[:2] in (["sparsity", "sparsity"], ["sparsity", "schedule"]):  # a level schedule: by its type
        node = raw.get("sparsity", {}).get(loc[1], {})
        for glob in loc[2:]:
            node = node.get(glob, {}) if isinstance(node, dict) else {}
        return LEVEL_TYPES.get(str(node.get("type", "")).lower()) if isinstance(node, dict) else None
    return RunConfig if loc == ["runconfig"] else None


def _translate(err: Any, raw: dict[str, Any]) -> Problem:
    loc = _user_loc(err["loc"])
    sparsity = raw.get("sparsity")
    if loc[:2] == ["sparsity", "sparsity"] and isinstance(sparsity, dict) and "schedule" in sparsity:
        loc[1] = "schedule"  # cerebras.pytorch's other name for it, as the file has it
    kind = err["type"]
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        tag = err.get("ctx", {}).get("tag")
        if tag:
            return Problem("model.name", f"must be one of {_MODEL_NAMES}", tag)
        return Problem("model.name", _missing_name(raw.get("model")))
    if kind == "missing":
        return Problem(_user_path(loc, raw), "is required but missing")
    if kind == "extra_forbidden":
        key = loc[-1]
        cls = _section_class(loc[:-1], raw)
        allowed = sorted(cls.model_fields) if cls else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return Problem(_user_path(loc, raw), f"is not a known key{hint} allowed here: {', '.join(allowed)}")
    msg = err["msg"].removeprefix("Value error, ")
    return Problem(_user_path(loc, raw), msg, err.get("input"))


def _missing_name(model: Any) -> str:
    """ModelZoo 2.4 and later require ``model.name``; older legacy files left it out. Say which line to
    add, guessed from the keys the file does have."""
    keys = model if isinstance(model, dict) else {}
    if "input_size" in keys:
        guess = "fc_mlp"
    elif keys.get("position_embedding_type") == "rotary" or keys.get("norm_type") == "rmsnorm":
        guess = "llama"
    else:
        guess = "gpt2"
    return (
        f"is missing: add the line `name: {guess}` under `model:` (ModelZoo 2.4 and later require "
        f"model.name; these keys look like {guess}'s); allowed: {_MODEL_NAMES}"
    )

"""Read, validate and resolve a params file. Nothing is scheduled before this has passed.

``load_params`` collects *every* problem (unsupported ModelZoo keys, pydantic's per-key errors, then
checks across sections) and raises one ``ParamsError`` listing them, each with its key path.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from weightstream.numerics import (
    FCMLPConfig,
    GPT2Config,
    ModelDef,
    OptimizerConfig,
    SchedulePiece,
    build_fc_mlp,
    build_gpt2,
)
from weightstream.params.errors import ParamsError, Problem
from weightstream.params.modelzoo import UNSUPPORTED
from weightstream.params.schema import (
    FCMLPModelParams,
    GPT2ModelParams,
    InputParams,
    OptimizerParams,
    Params,
    RunConfig,
    SchedulePieceParams,
)
from weightstream.params.size import num_params

__all__ = ["UNSUPPORTED", "dump_params", "load_params", "model_def", "optimizer_config", "parse_params"]

_SECTIONS = ("train_input", "eval_input", "model", "optimizer", "runconfig")


def parse_params(text: str, source: str = "params") -> dict[str, Any]:
    """YAML text -> a mapping (not yet validated)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ParamsError([Problem("<file>", f"is not valid YAML: {e}")], source) from e
    if not isinstance(raw, dict):
        raise ParamsError(
            [
                Problem(
                    "<file>", "must be a mapping with sections " + ", ".join(_SECTIONS), type(raw).__name__
                )
            ],
            source,
        )
    return raw


def load_params(
    params: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> Params:
    """Validate a params file (a path, or an already parsed mapping); ``overrides`` replace keys of
    ``runconfig`` (the CLI's ``--num_csx`` and friends). Raises ``ParamsError`` listing every problem."""
    if isinstance(params, str | Path):
        path = Path(params)
        source = source or str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ParamsError([Problem("<file>", f"cannot be read: {e.strerror}", str(path))], source) from e
        raw = parse_params(text, source)
    else:
        raw = dict(params)
    source = source or "params"
    if overrides:
        rc = raw.get("runconfig")
        raw["runconfig"] = {**(rc if isinstance(rc, dict) else {}), **overrides}

    problems = _unsupported(raw)
    try:
        parsed = Params.model_validate(raw)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        problems += [_translate(err, raw) for err in errors]
        # Also run the cross-section checks where possible (without the failing keys, which then take
        # their defaults), so one run reports as much as it can instead of one problem per attempt.
        try:
            pruned = Params.model_validate(_without(raw, [list(err["loc"]) for err in errors]))
        except ValidationError:
            pruned = None
        if pruned is not None:
            seen = {q.path for q in problems}
            problems += [q for q in cross_check(pruned) if q.path not in seen]
        raise ParamsError(problems, source) from None
    problems += cross_check(parsed)
    if problems:
        raise ParamsError(problems, source)
    return parsed


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
        for key in [k for k in d if k in keys]:
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
    loc = list(loc)
    if len(loc) >= 2 and loc[0] == "model" and loc[1] in ("gpt2", "fc_mlp"):
        del loc[1]
    return loc


def _path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<file>"


def _section_class(loc: list[Any], raw: dict[str, Any]) -> type[BaseModel] | None:
    if not loc:
        return Params
    if loc[0] in ("train_input", "eval_input") and len(loc) == 1:
        return InputParams
    if loc == ["model"]:
        name = raw.get("model", {}).get("name") if isinstance(raw.get("model"), dict) else None
        return {"gpt2": GPT2ModelParams, "fc_mlp": FCMLPModelParams}.get(name)  # type: ignore[arg-type]
    if loc == ["optimizer"]:
        return OptimizerParams
    if loc[:2] == ["optimizer", "learning_rate"] and len(loc) == 3:
        return SchedulePieceParams
    return RunConfig if loc == ["runconfig"] else None


def _translate(err: Any, raw: dict[str, Any]) -> Problem:
    loc = _user_loc(err["loc"])
    kind = err["type"]
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        tag = err.get("ctx", {}).get("tag")
        return Problem(
            "model.name",
            "must be one of 'gpt2', 'fc_mlp'" if tag else "is missing; allowed: 'gpt2', 'fc_mlp'",
            *((tag,) if tag else ()),
        )
    if kind == "missing":
        return Problem(_path(loc), "is required but missing")
    if kind == "extra_forbidden":
        key = loc[-1]
        cls = _section_class(loc[:-1], raw)
        allowed = sorted(cls.model_fields) if cls else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return Problem(_path(loc), f"is not a known key{hint} allowed here: {', '.join(allowed)}")
    msg = err["msg"].removeprefix("Value error, ")
    return Problem(_path(loc), msg, err.get("input"))


def cross_check(p: Params) -> list[Problem]:
    """Checks that relate keys of different sections."""
    problems: list[Problem] = []
    rc, m = p.runconfig, p.model
    inputs = [("train_input", p.train_input)] + ([("eval_input", p.eval_input)] if p.eval_input else [])
    for sec, inp in inputs:
        if inp.batch_size % rc.num_csx:
            problems.append(
                Problem(
                    f"{sec}.batch_size",
                    f"must be divisible by runconfig.num_csx={rc.num_csx} "
                    "(the global batch is split evenly across CS-2 workers)",
                    inp.batch_size,
                )
            )
        if inp.data_processor in ("TextFileDataProcessor", "TokenFileDataProcessor") and not inp.data_dir:
            problems.append(Problem(f"{sec}.data_dir", f"is required by {inp.data_processor}"))
        problems += _check_input_vs_model(sec, inp, m)
        shard = inp.batch_size // rc.num_csx
        if inp.micro_batch_size is not None and shard % inp.micro_batch_size:
            problems.append(
                Problem(
                    f"{sec}.micro_batch_size",
                    f"must divide the per-worker shard of {shard} samples "
                    f"(batch_size {inp.batch_size} / num_csx {rc.num_csx})",
                    inp.micro_batch_size,
                )
            )
    if rc.execution_mode == "pipelined" and rc.worker_memory_mb is not None:
        model_mb = num_params(p.model) * 4 / 2**20  # closed form: builds nothing
        if model_mb > rc.worker_memory_mb:
            problems.append(
                Problem(
                    "runconfig.execution_mode",
                    f"pipelined keeps the whole model ({model_mb:.1f} MiB) on each worker, more than "
                    f"worker_memory_mb={rc.worker_memory_mb}; use weight_streaming or auto",
                    "pipelined",
                )
            )
    if rc.eval_frequency and p.eval_input is None:
        problems.append(Problem("runconfig.eval_frequency", "needs an eval_input section", rc.eval_frequency))
    n_units = (m.num_hidden_layers + 2) if isinstance(m, GPT2ModelParams) else (m.depth + 1)
    if rc.num_wgt_servers > n_units:
        problems.append(
            Problem(
                "runconfig.num_wgt_servers",
                f"must be at most the model's {n_units} streamable "
                "units (whole units are assigned to weight servers)",
                rc.num_wgt_servers,
            )
        )
    if isinstance(m, GPT2ModelParams) and m.hidden_size % m.num_heads:
        problems.append(
            Problem("model.hidden_size", f"must be divisible by model.num_heads={m.num_heads}", m.hidden_size)
        )
    return problems + _check_optimizer(p.optimizer)


def _check_input_vs_model(sec: str, inp: InputParams, m: GPT2ModelParams | FCMLPModelParams) -> list[Problem]:
    problems = []
    dp = inp.data_processor
    if isinstance(m, GPT2ModelParams):
        if dp == "DigitsDataProcessor":
            problems.append(
                Problem(
                    f"{sec}.data_processor",
                    "DigitsDataProcessor feeds fc_mlp models; gpt2 takes "
                    "TextFileDataProcessor, TokenFileDataProcessor or SyntheticDataProcessor",
                    dp,
                )
            )
        if inp.max_sequence_length is None:
            problems.append(Problem(f"{sec}.max_sequence_length", "is required for gpt2"))
        elif inp.max_sequence_length > m.max_position_embeddings:
            problems.append(
                Problem(
                    f"{sec}.max_sequence_length",
                    f"must be at most model.max_position_embeddings={m.max_position_embeddings}",
                    inp.max_sequence_length,
                )
            )
        if dp == "TextFileDataProcessor" and m.vocab_size < 256:
            problems.append(
                Problem(
                    "model.vocab_size",
                    "must be at least 256 for TextFileDataProcessor (byte-level tokens)",
                    m.vocab_size,
                )
            )
    else:
        if dp in ("TextFileDataProcessor", "TokenFileDataProcessor"):
            problems.append(
                Problem(
                    f"{sec}.data_processor",
                    f"{dp} feeds gpt2 models; fc_mlp takes DigitsDataProcessor or SyntheticDataProcessor",
                    dp,
                )
            )
        if dp == "DigitsDataProcessor" and (m.input_size != 64 or m.num_classes < 10):
            problems.append(
                Problem(
                    "model.input_size",
                    "DigitsDataProcessor gives 64 features (8x8 images) and "
                    "10 classes: set input_size: 64 and num_classes: 10",
                    m.input_size,
                )
            )
        if inp.max_sequence_length is not None:
            problems.append(
                Problem(f"{sec}.max_sequence_length", "applies to gpt2 models only", inp.max_sequence_length)
            )
    return problems


def _check_optimizer(o: OptimizerParams) -> list[Problem]:
    problems = []
    if o.optimizer_type != "sgd":
        for key in ("momentum", "nesterov"):
            if getattr(o, key):
                problems.append(
                    Problem(
                        f"optimizer.{key}",
                        f"applies to optimizer_type sgd only, not {o.optimizer_type}",
                        getattr(o, key),
                    )
                )
    elif o.nesterov and o.momentum == 0:
        problems.append(Problem("optimizer.nesterov", "needs optimizer.momentum > 0", True))
    for i, piece in enumerate(o.learning_rate):
        at = f"optimizer.learning_rate[{i}]"
        last = i == len(o.learning_rate) - 1
        if piece.scheduler == "Constant":
            if piece.learning_rate is None and piece.initial_learning_rate is None:
                problems.append(Problem(f"{at}.learning_rate", "is required by the Constant scheduler"))
            if piece.total_iters is None and not last:
                problems.append(Problem(f"{at}.total_iters", "is required for every piece but the last"))
        else:
            for key in ("initial_learning_rate", "end_learning_rate", "total_iters"):
                if getattr(piece, key) is None:
                    problems.append(Problem(f"{at}.{key}", f"is required by the {piece.scheduler} scheduler"))
            if piece.learning_rate is not None:
                problems.append(
                    Problem(
                        f"{at}.learning_rate",
                        f"applies to Constant pieces; {piece.scheduler} "
                        "takes initial_learning_rate and end_learning_rate",
                        piece.learning_rate,
                    )
                )
    return problems


# ---------------------------------------------------------------------------------------------------------
# From validated params to the numerics' own configs
# ---------------------------------------------------------------------------------------------------------
def model_def(p: Params) -> ModelDef:
    m = p.model
    if isinstance(m, GPT2ModelParams):
        return build_gpt2(
            GPT2Config(
                vocab_size=m.vocab_size,
                n_positions=m.max_position_embeddings,
                n_embd=m.hidden_size,
                n_layer=m.num_hidden_layers,
                n_head=m.num_heads,
                n_inner=m.inner_size,
                layer_norm_epsilon=m.layer_norm_epsilon,
                initializer_range=m.initializer_range,
                tie_word_embeddings=m.share_embedding_weights,
            )
        )
    return build_fc_mlp(FCMLPConfig(m.input_size, (m.hidden_size,) * m.depth, m.num_classes))


def optimizer_config(o: OptimizerParams) -> OptimizerConfig:
    pieces = []
    for piece in o.learning_rate:
        if piece.scheduler == "Constant":
            lr = piece.learning_rate if piece.learning_rate is not None else piece.initial_learning_rate
            assert lr is not None  # cross_check guarantees it
            pieces.append(SchedulePiece("Constant", lr, lr, piece.total_iters or 1 << 62))
        else:
            assert piece.initial_learning_rate is not None and piece.end_learning_rate is not None
            assert piece.total_iters is not None
            pieces.append(
                SchedulePiece(
                    piece.scheduler, piece.initial_learning_rate, piece.end_learning_rate, piece.total_iters
                )
            )
    return OptimizerConfig(
        kind=o.optimizer_type,
        schedule=tuple(pieces),
        betas=o.betas,
        eps=o.eps,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        nesterov=o.nesterov,
        max_gradient_norm=o.max_gradient_norm,
    )


def dump_params(p: Params) -> str:
    """The resolved params (every default filled in) as YAML, as written to model_dir/params.yaml."""
    return yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False)

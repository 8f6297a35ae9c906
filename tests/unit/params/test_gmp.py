"""``sparsity: {algorithm: gmp}`` as a params file: what loads and resolves to which dynamic specs, what is
refused naming the key, the file written back, and the density reported for the end of the run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.params_files import SPARSE_GPT2
from weightstream.numerics.sparsity_schedule import LEVEL_KINDS, LevelSchedule, UpdateSchedule
from weightstream.params import ParamsError, dump_params, load_params, model_def
from weightstream.params.schema import GPT2ModelParams
from weightstream.params.sparsity import model_density, sparsity_specs
from weightstream.params.sparsity_schema import LEVEL_TYPES

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)

LINEAR = {"type": "linear", "init": 0.1, "slope": 0.05}
EXP = {"type": "exp", "init": 0.25, "gamma": -0.1, "final": 0.75}  # final - (final - init) = init exactly
COSINE = {"type": "cosine", "init": 0.5, "half_period": 7}
# SPARSE_GPT2's linear weights, 2 layers of [H, 3H], [H, H], [H, F], [F, H] (H 128, F 512)
ATTN, PROJ, FC, MLP_PROJ = "attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"
LINEARS = [f"transformer.h.{i}.{n}" for i in range(2) for n in (ATTN, PROJ, FC, MLP_PROJ)]


def _write(tmp: Path, sparsity: dict[str, Any], max_steps: int | None = None) -> Path:
    p = copy.deepcopy(SPARSE_GPT2)
    p["sparsity"] = sparsity
    if max_steps is not None:
        p["runconfig"]["max_steps"] = max_steps
    path = tmp / f"params-{len(list(tmp.glob('params*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))  # the file's order: the first glob wins
    return path


def _f32(x: float) -> float:
    return float(np.float32(x))


EVERY_LINEAR = dict.fromkeys(LINEARS, LINEAR)
GMP_LINEAR = {"algorithm": "gmp", "sparsity": LINEAR}
ACCEPTED = [
    # name, sparsity block, {tensor: its level schedule (as the file writes it)}, update, start level
    ("schedule alias", {"algorithm": "gmp", "schedule": LINEAR}, EVERY_LINEAR, {}, _f32(0.1)),
    (
        "upper case",
        {"algorithm": "GMP", "sparsity": {**EXP, "type": "Exp"}},
        dict.fromkeys(LINEARS, EXP),
        {},
        0.25,
    ),
    (
        "per glob",
        {"algorithm": "gmp", "sparsity": {f"*.{FC}": EXP, "*.c_proj.weight": COSINE}},
        {n: EXP if n.endswith(FC) else COSINE for n in LINEARS if n.endswith((FC, PROJ, MLP_PROJ))},
        {},
        None,  # each schedule's init
    ),
    # step 0 is no update step: dense until step 5
    (
        "freq start stop",
        {**GMP_LINEAR, "update": {"freq": 2, "start": 5, "stop": 9}},
        EVERY_LINEAR,
        {"freq": 2, "start": 5, "stop": 9},
        0.0,
    ),
    ("freq", {**GMP_LINEAR, "update": {"freq": 3}}, EVERY_LINEAR, {"freq": 3}, _f32(0.1)),
    (
        "steps",
        {**GMP_LINEAR, "update": {"steps": [0, 3, 6]}, "seed": 3},
        EVERY_LINEAR,
        {"steps": (0, 3, 6)},
        _f32(0.1),
    ),
    ("steps from 2", {**GMP_LINEAR, "update": {"steps": [2, 4]}}, EVERY_LINEAR, {"steps": (2, 4)}, 0.0),
]


@pytest.mark.parametrize("name,block,levels,update,start", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_gmp_forms_resolve_to_dynamic_specs(
    tmp_path: Path,
    name: str,
    block: dict[str, Any],
    levels: dict[str, dict[str, Any]],
    update: dict[str, Any],
    start: float | None,
) -> None:
    p = load_params(_write(tmp_path, block))
    assert p.sparsity is not None and p.sparsity.algorithm == "gmp"
    specs = sparsity_specs(p, model_def(p))
    assert list(specs) == list(levels), name  # the model's order, only the tensors a glob selects
    for n, spec in specs.items():
        level = levels[n]
        keys = {k: float(v) for k, v in level.items() if k != "type"}
        assert spec.dynamic and spec.schedule == LevelSchedule(level["type"], **keys), n
        assert spec.update == UpdateSchedule(**update), n
        assert spec.sparsity == (keys["init"] if start is None else start), n
        assert spec.seed == block.get("seed", SPARSE_GPT2["runconfig"]["seed"])
        assert spec.init_method == "random"


REFUSED = [
    # name, sparsity block, key path, a piece of the message
    (
        "gmp with a level",
        {"algorithm": "gmp", "sparsity": 0.5},
        "sparsity.sparsity",
        "a constant level never",
    ),
    (
        "gmp with a level per glob",
        {"algorithm": "gmp", "sparsity": {f"*.{FC}": LINEAR, "*": 0.5}},
        "sparsity.sparsity",
        "gmp needs a level schedule",
    ),
    ("static with a schedule", {"sparsity": LINEAR}, "sparsity.sparsity", "needs algorithm: gmp"),
    (
        "update with static",
        {"sparsity": 0.5, "update": {"freq": 2}},
        "sparsity.update",
        "needs algorithm: gmp",
    ),
    (
        "key of another type",
        {"algorithm": "gmp", "sparsity": {**LINEAR, "gamma": -0.1}},
        "sparsity.sparsity.gamma",
        "is not a known key allowed here: init, slope, type",
    ),
    (
        "missing key",
        {"algorithm": "gmp", "sparsity": {"type": "linear", "init": 0.1}},
        "sparsity.sparsity.slope",
        "is required but missing",
    ),
    (
        "missing key per glob",
        {"algorithm": "gmp", "sparsity": {f"*.{FC}": {"type": "exp", "gamma": -0.1}}},
        f"sparsity.sparsity['*.{FC}'].init",
        "is required but missing",
    ),
    (
        "cycling",
        {"algorithm": "gmp", "sparsity": {"type": "cycling", "values": [0.1, 0.2]}},
        "sparsity.sparsity.type",
        "cycling level schedule is not implemented",
    ),
    (
        "constant",
        {"algorithm": "gmp", "sparsity": {"type": "Constant", "value": 0.5}},
        "sparsity.sparsity.type",
        "write the level itself with algorithm: static",
    ),
    (
        "unknown type",
        {"algorithm": "gmp", "sparsity": {"type": "sawtooth", "init": 0.5}},
        "sparsity.sparsity.type",
        "must be one of linear, exp, power, cosine",
    ),
    (
        "cosine without a period",
        {"algorithm": "gmp", "sparsity": {**COSINE, "half_period": 0}},
        "sparsity.sparsity.half_period",
        "must not be 0",
    ),
    ("rigl", {"algorithm": "rigl", "sparsity": LINEAR}, "sparsity.algorithm", "'rigl' is not implemented"),
    (  # named as the file writes it
        "schedule key of another type",
        {"algorithm": "gmp", "schedule": {**LINEAR, "beta": 0.9}},
        "sparsity.schedule.beta",
        "allowed here: init, slope, type",
    ),
    (  # found when the file is read, not at step 2 of the run: 0 * inf
        "a NaN level",
        {"algorithm": "gmp", "sparsity": {"type": "power", "init": 0.0, "beta": 1e30}},
        "sparsity.sparsity",
        "gives NaN at step 2",
    ),
    (
        "sparsity and schedule",
        {"algorithm": "gmp", "sparsity": LINEAR, "schedule": LINEAR},
        "sparsity",
        "give one of sparsity and schedule",
    ),
    (
        "freq 0",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {"freq": 0}},
        "sparsity.update.freq",
        "than 0",
    ),
    (
        "negative start",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {"freq": 2, "start": -1}},
        "sparsity.update.start",
        "greater than or equal to 0",
    ),
    (
        "steps and freq",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {"steps": [1, 2], "freq": 2}},
        "sparsity.update",
        "either steps or freq/start/stop",
    ),
    (
        "empty steps",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {"steps": []}},
        "sparsity.update",
        "at least one step",
    ),
    (
        "no freq",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {}},
        "sparsity.update",
        "needs freq (or steps)",
    ),
    (
        "unknown update key",
        {"algorithm": "gmp", "sparsity": LINEAR, "update": {"freq": 2, "every": 3}},
        "sparsity.update.every",
        "not a known key",
    ),
]


@pytest.mark.parametrize("name,block,path,word", REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_gmp_blocks_are_refused_naming_the_key(
    tmp_path: Path, name: str, block: dict[str, Any], path: str, word: str
) -> None:
    with pytest.raises(ParamsError) as info:
        load_params(_write(tmp_path, block))
    paths = [p.path for p in info.value.problems]
    assert path in paths, f"{name}: expected a problem at {path}, got {paths}"
    msg = next(str(p) for p in info.value.problems if p.path == path)
    assert word in msg, f"{name}: message {msg!r} lacks {word!r}"


def test_every_size_has_a_bound() -> None:
    """Too many listed steps, refused by name. Loaded as the dict a file reads to: the bound is the
    schema's, and a file of 100 001 steps would spend seconds in PyYAML's pure-Python loader."""
    raw = copy.deepcopy(SPARSE_GPT2)
    raw["sparsity"] = {"algorithm": "gmp", "sparsity": LINEAR, "update": {"steps": list(range(100_001))}}
    with pytest.raises(ParamsError) as info:
        load_params(raw)
    problems = {p.path: str(p) for p in info.value.problems}
    assert "at most 100000 items" in problems["sparsity.update.steps"], problems


def test_a_gmp_file_is_written_back_as_it_reads(tmp_path: Path) -> None:
    """model_dir/params.yaml: loads to equal params and specs, globs in the file's order, each level
    schedule with its type's keys only (optional ones filled in)."""
    power = {"type": "power", "init": 0.2, "beta": 1.01}
    block = {
        "algorithm": "gmp",
        "schedule": {f"*.{FC}": EXP, "*.c_proj.weight": power, "*": COSINE},
        "update": {"freq": 3, "start": 1, "stop": 11},
        "init_method": "topk",
    }
    p = load_params(_write(tmp_path, block))
    again = tmp_path / "dumped.yaml"
    again.write_text(dump_params(p))
    q = load_params(again)
    assert q == p
    assert sparsity_specs(q, model_def(q)) == sparsity_specs(p, model_def(p))
    written = yaml.safe_load(again.read_text())["sparsity"]
    assert list(written["sparsity"]) == [f"*.{FC}", "*.c_proj.weight", "*"]
    assert written["sparsity"][f"*.{FC}"] == EXP
    assert written["sparsity"]["*.c_proj.weight"] == power
    assert written["sparsity"]["*"] == {**COSINE, "half_period": 7.0, "minimum": 0.0}
    assert written["update"] == {"freq": 3, "start": 1, "stop": 11, "steps": None}
    assert written["algorithm"] == "gmp" and "schedule" not in written


def _num_params(h: int, f: int, layers: int, vocab: int, positions: int) -> int:
    """GPT-2's tensors: embeddings (the LM head tied), per layer two norms, q/k/v, the attention
    projection and the MLP with their biases, the final norm."""
    layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    return vocab * h + positions * h + layers * layer + 2 * h


@pytest.mark.parametrize(
    "update,last",
    [
        ({"freq": 3, "start": 1, "stop": 11}, 10),
        ({"steps": [0, 4, 30]}, 4),
        ({}, 12),
        ({"steps": [0, 13]}, 0),
    ],
    ids=["freq", "steps", "every step", "only the start"],
)
def test_model_density_is_the_level_at_the_last_update(
    tmp_path: Path, update: dict[str, Any], last: int
) -> None:
    """balanced-topk: the first mask keeps as many in every row; gmp's later ones rank the whole tensor."""
    block = {"algorithm": "gmp", "sparsity": {f"*.{FC}": EXP, "*": LINEAR}, "init_method": "balanced-topk"}
    p = load_params(_write(tmp_path, block | ({"update": update} if update else {}), max_steps=12))
    m = p.model
    assert isinstance(m, GPT2ModelParams)
    h, f = m.hidden_size, m.filter_size
    assert f is not None
    s = torch.tensor(last, dtype=torch.int64)
    # cerebras.pytorch's Exp and Linear at the last update step, and make_mask_topk_sparsity's count
    exp = torch.tensor(0.75) - (torch.tensor(0.75) - torch.tensor(0.25)) * torch.exp(s * torch.tensor(-0.1))
    linear = torch.tensor(0.1) + s * torch.tensor(0.05)
    pruned = 0
    for (rows, cols), level in (((h, 3 * h), linear), ((h, h), linear), ((h, f), exp), ((f, h), linear)):
        density = 1 - torch.clamp(level, min=0.0, max=1.0)
        if last == 0:
            kept = rows * (density * torch.tensor(cols, dtype=torch.float)).int().item()
        else:
            kept = (density * torch.tensor(rows * cols, dtype=torch.float)).int().item()
        pruned += m.num_hidden_layers * (rows * cols - kept)
    total = _num_params(h, f, m.num_hidden_layers, m.vocab_size, m.max_position_embeddings)
    assert model_density(p, model_def(p)) == 1.0 - pruned / total


def test_a_gmp_run_that_ends_before_its_first_update_is_dense(tmp_path: Path) -> None:
    p = load_params(
        _write(tmp_path, {"algorithm": "gmp", "sparsity": LINEAR, "update": {"freq": 5, "start": 20}})
    )
    assert model_density(p, model_def(p)) == 1.0


def test_the_schema_and_the_numerics_know_the_same_level_types() -> None:
    assert set(LEVEL_TYPES) == set(LEVEL_KINDS)

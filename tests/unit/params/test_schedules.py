"""Learning-rate schedule pieces in params files: ModelZoo's spellings, defaults and key checks, and the
resolved params reloading to the same schedule."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from numpy.testing import assert_allclose

from tests.modelzoo_schedules import mz_polynomial, mz_sequential, ours
from weightstream.numerics.optim import SchedulePiece
from weightstream.params import ParamsError, dump_params, load_params, optimizer_config

# ---------------------------------------------------------------------------------------------------------
# The params
# ---------------------------------------------------------------------------------------------------------
BASE: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 4, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 256,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_heads": 2,
        "filter_size": 64,
        "max_position_embeddings": 16,
    },
    "optimizer": {
        "optimizer_type": "adamw",
        "learning_rate": [
            {
                "scheduler": "Linear",
                "initial_learning_rate": 0.0,
                "end_learning_rate": 1e-2,
                "total_iters": 5,
            },
            {"scheduler": "Exponential", "initial_learning_rate": 1e-2, "total_iters": 10, "decay_rate": 0.5},
        ],
    },
    "runconfig": {"num_csx": 1, "max_steps": 40, "model_dir": "./model_dir/schedules"},
}


def with_piece(**piece: Any) -> dict[str, Any]:
    """BASE with optimizer.learning_rate[1] replaced by ``piece``."""
    raw = copy.deepcopy(BASE)
    raw["optimizer"]["learning_rate"][1] = piece
    return raw


def schedule_of(raw: dict[str, Any]) -> tuple[SchedulePiece, ...]:
    return optimizer_config(load_params(raw).optimizer).schedule


EXP = {"initial_learning_rate": 1e-2, "total_iters": 10, "decay_rate": 0.5}
POLY = {"initial_learning_rate": 1e-2, "end_learning_rate": 1e-4, "total_iters": 10}


@pytest.mark.parametrize(
    "piece,expected",
    [
        ({"scheduler": "Exponential", **EXP}, SchedulePiece("Exponential", 1e-2, 1e-2, 10, decay_rate=0.5)),
        (
            {"scheduler": "ExponentialLR", **EXP, "staircase": True},
            SchedulePiece("Exponential", 1e-2, 1e-2, 10, decay_rate=0.5, staircase=True),
        ),
        (
            {"scheduler": "exponential", "initial_learning_rate": 1e-2, "decay_steps": 10, "decay_rate": 0.5},
            SchedulePiece("Exponential", 1e-2, 1e-2, 10, decay_rate=0.5),
        ),
        ({"scheduler": "Polynomial", **POLY}, SchedulePiece("Polynomial", 1e-2, 1e-4, 10, power=1.0)),
        (
            {"scheduler": "PolynomialLR", **POLY, "power": 2.5, "cycle": False},
            SchedulePiece("Polynomial", 1e-2, 1e-4, 10, power=2.5),
        ),
        (
            {
                "scheduler": "polynomial",
                "initial_learning_rate": 1e-2,
                "end_learning_rate": 1e-4,
                "steps": 10,
            },
            SchedulePiece("Polynomial", 1e-2, 1e-4, 10, power=1.0),
        ),
    ],
    ids=[
        "exponential",
        "ExponentialLR staircase",
        "decay_steps",
        "polynomial",
        "PolynomialLR power",
        "steps",
    ],
)
def test_params_spellings_and_defaults(piece: dict[str, Any], expected: SchedulePiece) -> None:
    """ModelZoo's names (with or without LR, any case), its older decay_steps/steps for total_iters, and
    its defaults where a key is left out (staircase false, power 1)."""
    assert schedule_of(with_piece(**piece))[1] == expected


def test_resolved_params_reload_to_the_same_schedule(tmp_path: Path) -> None:
    """Roles load the params the coordinator dumps: every new key survives dump -> load."""
    raw = copy.deepcopy(BASE)
    raw["optimizer"]["learning_rate"] = [
        {"scheduler": "Polynomial", **POLY, "power": 0.5, "cycle": True},
        {
            "scheduler": "Linear",
            "initial_learning_rate": 1e-4,
            "end_learning_rate": 0.0,
            "total_iters": 3,
            "alpha": 0.1,
        },
        {
            "scheduler": "Exponential",
            "initial_learning_rate": 1e-3,
            "total_iters": 4,
            "decay_rate": 0.9,
            "staircase": True,
        },
    ]
    first = load_params(raw)
    (tmp_path / "params.yaml").write_text(dump_params(first))
    again = load_params(tmp_path / "params.yaml")
    assert again.optimizer == first.optimizer
    assert optimizer_config(again.optimizer).schedule == optimizer_config(first.optimizer).schedule


def test_polynomial_cycle_is_modelzoos_and_changes_nothing() -> None:
    """ModelZoo's cycle factor ceil((t + 1) / total_iters) is 1 wherever it is used, and the end value
    is returned from total_iters on, so cycle: true gives ModelZoo's (and our) cycle: false schedule."""
    cycled = schedule_of(with_piece(scheduler="Polynomial", **POLY, power=2.0, cycle=True))
    plain = schedule_of(with_piece(scheduler="Polynomial", **POLY, power=2.0))
    assert cycled == plain
    reference = mz_sequential(
        [mz_polynomial(0.0, 1e-2, 5, 1.0, True), mz_polynomial(1e-2, 1e-4, 10, 2.0, True)], [5, 10]
    )
    steps = [*range(60), 1000]
    assert_allclose([ours(cycled)(t) for t in steps], [reference(t) for t in steps], rtol=1e-15, atol=1e-19)


def test_alpha_and_cycle_on_a_linear_piece_change_nothing() -> None:
    """ModelZoo's older GPT-2 files carry alpha on a Linear piece; ModelZoo never used it."""
    linear = {
        "scheduler": "Linear",
        "initial_learning_rate": 1e-2,
        "end_learning_rate": 0.0,
        "total_iters": 10,
    }
    assert schedule_of(with_piece(**linear, alpha=0.1, cycle=True)) == schedule_of(with_piece(**linear))


PIECE = "optimizer.learning_rate[1]"
# (what is wrong, the piece, the key path the message must name, a pattern its message must match)
BAD = [
    (
        "no decay_rate",
        {"scheduler": "Exponential", **EXP, "decay_rate": None},
        f"{PIECE}.decay_rate",
        "required by the Exponential",
    ),
    (
        "negative decay_rate",
        {"scheduler": "Exponential", **EXP, "decay_rate": -0.5},
        f"{PIECE}.decay_rate",
        "greater than or equal to 0",
    ),
    (
        "text decay_rate",
        {"scheduler": "Exponential", **EXP, "decay_rate": "half"},
        f"{PIECE}.decay_rate",
        "number",
    ),
    (
        "no total_iters",
        {"scheduler": "Exponential", **EXP, "total_iters": None},
        f"{PIECE}.total_iters",
        "required by the Exponential",
    ),
    (
        "end on exponential",
        {"scheduler": "Exponential", **EXP, "end_learning_rate": 0.0},
        f"{PIECE}.end_learning_rate",
        "Linear, CosineDecay and Polynomial pieces, not Exponential",
    ),
    (
        "lr on exponential",
        {"scheduler": "Exponential", **EXP, "learning_rate": 1e-2},
        f"{PIECE}.learning_rate",
        "Exponential takes initial_learning_rate$",
    ),
    (
        "staircase on polynomial",
        {"scheduler": "Polynomial", **POLY, "staircase": True},
        f"{PIECE}.staircase",
        "Exponential pieces, not Polynomial",
    ),
    (
        "negative power",
        {"scheduler": "Polynomial", **POLY, "power": -1.0},
        f"{PIECE}.power",
        "greater than or equal to 0",
    ),
    (
        "no end on polynomial",
        {"scheduler": "Polynomial", **POLY, "end_learning_rate": None},
        f"{PIECE}.end_learning_rate",
        "required by the Polynomial",
    ),
    (
        "power on linear",
        {"scheduler": "Linear", **POLY, "power": 2.0},
        f"{PIECE}.power",
        "Polynomial pieces, not Linear",
    ),
    (
        "cycle on cosine",
        {"scheduler": "CosineDecay", **POLY, "cycle": True},
        f"{PIECE}.cycle",
        "Linear and Polynomial pieces",
    ),
    (
        "alpha on cosine",
        {"scheduler": "CosineDecay", **POLY, "alpha": 0.1},
        f"{PIECE}.alpha",
        r"alpha \* initial_learning_rate",
    ),
    (
        "end on constant",
        {"scheduler": "Constant", "learning_rate": 1e-3, "end_learning_rate": 0.0},
        f"{PIECE}.end_learning_rate",
        "not Constant",
    ),
    (
        "both spellings",
        {"scheduler": "Exponential", **EXP, "decay_steps": 10},
        PIECE,
        "decay_steps and total_iters",
    ),
    (
        "unknown scheduler",
        {"scheduler": "StepLR", **EXP},
        f"{PIECE}.scheduler",
        "'Exponential' or 'Polynomial'",
    ),
]


@pytest.mark.parametrize("name,piece,path,words", BAD, ids=[b[0] for b in BAD])
def test_bad_pieces_rejected_naming_the_key(name: str, piece: dict[str, Any], path: str, words: str) -> None:
    piece = {k: v for k, v in piece.items() if v is not None}
    with pytest.raises(ParamsError) as info:
        load_params(with_piece(**piece))
    named = [p for p in info.value.problems if p.path == path]
    assert named, f"no problem at {path}: {info.value}"
    assert any(re.search(words, p.message) for p in named), str(info.value)

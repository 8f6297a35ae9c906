"""``weightstream config convert``: a legacy-layout params file rewritten in the ``trainer:`` layout.

The result means exactly what the original means: read back (``trainer_layout.py``), it resolves to the
same params, so it trains bitwise the same. Keys are moved, never dropped, except the few that have no
place in the ``trainer:`` layout at all (``runconfig.mode``): those are returned as notes.
"""

from __future__ import annotations

import copy
from typing import Any

from weightstream.params.optimizer_schema import SCHEDULERS, canonical_scheduler
from weightstream.params.trainer_keys import PLAIN

__all__ = ["to_trainer"]

_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}
# legacy path -> (trainer.init section, key): the inverse of the trainer layout's plain tables
_HOME = {
    legacy: (section, key)
    for section, table in PLAIN.items()
    for key, legacy in table.items()
    if section != "cluster_config"
}
_CLUSTER = {legacy: key for key, legacy in PLAIN["cluster_config"].items()}


def _schedulers(lr: Any) -> list[dict[str, Any]]:
    if not isinstance(lr, list):  # a bare number: one constant piece
        return [{"ConstantLR": {"learning_rate": lr}}]
    pieces = []
    for piece in lr:
        settings = {k: v for k, v in piece.items() if k != "scheduler"}
        name = str(piece.get("scheduler", ""))
        known = canonical_scheduler(name)  # ModelZoo's classes are the legacy names + "LR"
        pieces.append({f"{known}LR" if known in SCHEDULERS else name: settings})
    return pieces if len(pieces) == 1 else [{"SequentialLR": {"schedulers": pieces}}]


def to_trainer(legacy: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the ``trainer:`` mapping, notes on keys that have no place in it). ``legacy`` is a parsed
    legacy-layout file; it is not modified."""
    src = copy.deepcopy(legacy)
    init: dict[str, Any] = {}
    fit: dict[str, Any] = {}
    notes: list[str] = []
    callbacks: list[dict[str, Any]] = []

    def home(path: str, value: Any) -> bool:
        if path in _HOME:
            section, key = _HOME[path]
            target = init.setdefault("backend", {}) if section == "backend" else init.setdefault(section, {})
            target[key] = value
            return True
        if path in _CLUSTER:
            init.setdefault("backend", {}).setdefault("cluster_config", {})[_CLUSTER[path]] = value
            return True
        return False

    model = src.pop("model", {}) or {}
    for key in ("mixed_precision", "fp16_type"):  # trainer.init.precision
        if key in model:
            home(f"model.{key}", model.pop(key))
    init["model"] = model

    optimizer = src.pop("optimizer", {}) or {}
    kind = str(optimizer.pop("optimizer_type", "adamw"))
    lr = optimizer.pop("learning_rate", None)
    for key in list(optimizer):
        if home(f"optimizer.{key}", optimizer[key]):
            del optimizer[key]
    init["optimizer"] = {_OPTIMIZERS.get(kind.lower(), kind): optimizer}
    if lr is not None:
        init["schedulers"] = _schedulers(lr)

    if "sparsity" in src:
        init["sparsity"] = src.pop("sparsity")

    runconfig = src.pop("runconfig", {}) or {}
    for key, value in runconfig.items():
        if key in ("model_dir", "seed"):
            init[key] = value
        elif key == "checkpoint_path":
            fit["ckpt_path"] = value
        elif key == "keep_checkpoint_max":
            callbacks.append({"KeepNCheckpoints": {"n": value}})
        elif not home(f"runconfig.{key}", value):
            if key == "mode":
                notes.append(f"runconfig.mode: {value!r} has no place in the trainer: layout (left out)")
            else:  # weightstream's own keys: no ModelZoo home
                init.setdefault("weightstream", {})[key] = value

    for section, flags, target in (
        ("train_input", "ScopedTrainFlags", "train_dataloader"),
        ("eval_input", "ScopedValidateFlags", "val_dataloader"),
    ):
        inp = src.pop(section, None)
        if inp is None:
            continue
        if "micro_batch_size" in inp:
            callbacks.append({flags: {"csx.performance.micro_batch_size": inp.pop("micro_batch_size")}})
        fit[target] = inp
    if callbacks:
        init["callbacks"] = callbacks
    for key in src:  # anything else the legacy validation would have named; keep it visible
        notes.append(f"{key}: not a legacy section (left out)")

    # the order ModelZoo writes sections in
    order = [
        "backend", "model_dir", "seed", "model", "optimizer", "schedulers", "precision", "sparsity",
        "loop", "checkpoint", "logging", "callbacks", "weightstream",
    ]  # fmt: skip
    init = {k: init[k] for k in order if k in init}
    trainer: dict[str, Any] = {"init": init}
    if fit:
        trainer["fit"] = fit
    return {"trainer": trainer}, notes

"""ModelZoo's ``trainer:`` layout (release 2.3 and later), translated into the legacy layout.

    trainer.init.{backend, model_dir, seed, model, optimizer, schedulers, precision, sparsity, loop,
                  checkpoint, logging, callbacks, loggers, weightstream}
    trainer.fit.{train_dataloader, val_dataloader, ckpt_path}
    trainer.validate / trainer.validate_all  (ModelZoo's separate evaluation runs: understood, reported)

Every key lands where the legacy layout keeps it (``loop.max_steps`` is ``runconfig.max_steps``,
``precision.max_gradient_norm`` is ``optimizer.max_gradient_norm``, ``optimizer: {AdamW: {...}}`` is
``optimizer_type: adamw``, a ``SequentialLR`` is the list of schedule pieces), and the ``Origin`` keeps the
path the user wrote. Keys with no legacy home are reported here (``KeyUse``) or refused (``Problem``);
unknown keys are left in place so the legacy validation names them (with did-you-mean) at the path the
user wrote. ``trainer.init.weightstream`` holds weightstream's own ``runconfig`` keys, which ModelZoo has
no place for.
"""

from __future__ import annotations

from typing import Any

from weightstream.params.errors import Problem
from weightstream.params.layout import KeyUse, join
from weightstream.params.trainer_callbacks import callbacks, loggers
from weightstream.params.trainer_keys import HOMES, INIT_KEYS, PLAIN
from weightstream.params.translation import Translation

__all__ = ["HOMES", "PLAIN", "Translation", "from_trainer"]


def from_trainer(raw: dict[str, Any]) -> Translation:
    """The legacy-layout mapping of a ``trainer:`` file, its origin map, reports and problems."""
    t = Translation()
    trainer = raw["trainer"]
    for key in raw:
        if key != "trainer":
            t.unknown(key, key, ["trainer"])
    if isinstance(trainer, list):
        if len(trainer) != 1:
            t.problems.append(Problem("trainer", "several trainers in sequence are not supported: give one"))
            return t
        trainer, prefix = trainer[0], "trainer[0]"
    else:
        prefix = "trainer"
    if not isinstance(trainer, dict):
        t.problems.append(Problem(prefix, "must be a mapping with init and fit", type(trainer).__name__))
        return t
    for key, value in trainer.items():
        at = join(prefix, key)
        if key == "init":
            _init(t, value, at)
        elif key == "fit":
            _fit(t, value, at)
        elif key in ("validate", "validate_all"):
            t.report(
                at,
                "…",
                "ModelZoo's separate evaluation run: weightstream evaluates during training "
                "on trainer.fit.val_dataloader (eval_frequency, eval_steps)",
            )
        else:
            t.unknown(at, key, ["init", "fit", "validate", "validate_all"])
    for section in ("model", "optimizer"):
        t.legacy.setdefault(section, {})
    return t


def _plain(t: Translation, table: str, value: Any, at: str, extra: tuple[str, ...] = ()) -> None:
    for key, v in t.mapping(value, at).items():
        if key in PLAIN[table]:
            t.put(PLAIN[table][key], v, join(at, key))
        elif key not in extra:
            t.unknown(join(at, key), key, sorted(PLAIN[table]) + list(extra))


def _init(t: Translation, init: Any, at: str) -> None:
    init = t.mapping(init, at)
    for key, value in init.items():
        here = join(at, key)
        if key in ("model", "sparsity"):
            t.section(key, value, here)
        elif key in ("model_dir", "seed"):
            t.put(f"runconfig.{key}", value, here)
        elif key == "weightstream":  # weightstream's own runconfig keys
            for k, v in t.mapping(value, here).items():
                t.put(f"runconfig.{k}", v, join(here, k))
        elif key in ("loop", "checkpoint", "logging"):
            _plain(t, key, value, here)
        elif key == "backend":
            _plain(t, "backend", value, here, extra=("cluster_config",))
            cluster = t.mapping(value, here).get("cluster_config")
            if cluster is not None:
                _plain(t, "cluster_config", cluster, join(here, "cluster_config"))
        elif key == "precision":
            _precision(t, value, here)
        elif key == "optimizer":
            _optimizer(t, value, here)
        elif key == "schedulers":
            _schedulers(t, value, here)
        elif key == "callbacks":
            callbacks(t, value, here)
        elif key == "loggers":
            loggers(t, value, here)
        else:
            t.unknown(here, key, INIT_KEYS)
    if t.optimizer_lr is not None:
        lr, lr_at = t.optimizer_lr
        if "learning_rate" in t.legacy.get("optimizer", {}):  # ModelZoo: the schedulers win
            t.report(lr_at, lr, "the schedulers set the learning rate")
        else:
            t.put("optimizer.learning_rate", lr, lr_at)


def _precision(t: Translation, value: Any, at: str) -> None:
    # enabled is the legacy model.mixed_precision (load.py applies it to fp16_type in both layouts)
    _plain(t, "precision", value, at)


def _optimizer(t: Translation, value: Any, at: str) -> None:
    entry = t.one_entry(value, at, "optimizer")
    if entry is None:
        return
    name, settings = entry
    here = join(at, name)
    t.put("optimizer.optimizer_type", name, here)
    t.origin.add("optimizer", here)
    for key, v in t.mapping(settings, here).items():
        if key in ("lr", "learning_rate"):  # a constant rate, unless schedulers are given (_init decides)
            t.optimizer_lr = (v, join(here, key))
        else:
            t.put(f"optimizer.{key}", v, join(here, key))


def _schedulers(t: Translation, value: Any, at: str) -> None:
    if isinstance(value, list):
        if len(value) != 1:
            t.problems.append(
                Problem(
                    at, "one learning-rate schedule is supported (a SequentialLR for several pieces)", value
                )
            )
            return
        value, at_item = value[0], join(at, 0)
    else:
        at_item = at
    entry = t.one_entry(value, at_item, "scheduler")
    if entry is None:
        return
    name, settings = entry
    here = join(at_item, name)
    if name == "SequentialLR":
        settings = t.mapping(settings, here)
        for key in settings:
            if key not in ("schedulers", "milestones"):
                t.unknown(join(here, key), key, ["schedulers", "milestones"])
        pieces = settings.get("schedulers")
        if not isinstance(pieces, list) or not pieces:
            t.problems.append(Problem(join(here, "schedulers"), "must be a list of schedulers", pieces))
            return
        written = [(p, join(join(here, "schedulers"), i)) for i, p in enumerate(pieces)]
    else:
        written = [({name: settings}, at_item)]
    legacy = []
    for i, (piece, piece_at) in enumerate(written):
        one = t.one_entry(piece, piece_at, "scheduler")
        if one is None:
            continue
        piece_name, piece_settings = one
        name_at = join(piece_at, piece_name)
        legacy.append(
            {
                "scheduler": piece_name,  # LinearLR: the schema takes ModelZoo's every spelling
                **t.mapping(piece_settings, name_at),
            }
        )
        t.origin.add(f"optimizer.learning_rate[{i}]", name_at)
        t.origin.add(f"optimizer.learning_rate[{i}].scheduler", piece_at)
    t.put("optimizer.learning_rate", legacy, at)
    if name == "SequentialLR" and "milestones" in settings:
        _milestones(t, settings["milestones"], legacy, join(here, "milestones"))


def _milestones(t: Translation, given: Any, pieces: list[dict[str, Any]], at: str) -> None:
    """ModelZoo derives SequentialLR's milestones from the pieces' total_iters and refuses others: each
    piece starts where the one before ends."""
    iters = [p.get("total_iters", p.get("steps", p.get("decay_steps"))) for p in pieces[:-1]]
    ints = [n for n in iters if isinstance(n, int)]
    expected = [sum(ints[: i + 1]) for i in range(len(ints))] if len(ints) == len(iters) else None
    if expected is not None and given != expected:
        t.problems.append(
            Problem(
                at,
                f"must be the running sums of the pieces' total_iters, {expected}: each piece starts "
                "where the one before ends",
                given,
            )
        )
    else:
        t.uses.append(KeyUse(at, given, "used", "each piece starts where the one before ends"))


def _fit(t: Translation, fit: Any, at: str) -> None:
    for key, value in t.mapping(fit, at).items():
        here = join(at, key)
        if key == "train_dataloader":
            t.section("train_input", value, here)
        elif key == "val_dataloader":
            if isinstance(value, list):
                if len(value) != 1:
                    t.problems.append(Problem(here, "one val_dataloader is supported", len(value)))
                    continue
                value, here = value[0], join(here, 0)
            t.section("eval_input", value, here)
        elif key == "ckpt_path":
            t.put("runconfig.checkpoint_path", value, here)
        else:
            t.unknown(here, key, ["ckpt_path", "train_dataloader", "val_dataloader"])

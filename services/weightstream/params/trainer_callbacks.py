"""The ``callbacks:`` and ``loggers:`` lists of a ``trainer:`` file: each one used, reported as not
applicable (it changes nothing here) or refused with the reason."""

from __future__ import annotations

from typing import Any

from weightstream.params.errors import Problem
from weightstream.params.layout import join
from weightstream.params.translation import Translation

__all__ = ["callbacks", "loggers"]

_NOT_APPLICABLE_CALLBACKS = {
    "ComputeNorm": "the gradient norm is logged every log_steps anyway (metrics.jsonl)",
    "GlobalFlags": "Cerebras compiler and runtime flags: weightstream has no compiler",
    "CheckLoss": "a run stops on a non-finite loss anyway (see Faults)",
    "LogSparsity": "`weightstream validate` and the job list report the model's density",
    "LogInputSummaries": "what ModelZoo logs: weightstream logs loss, gradient norm and throughput",
    "DebugArgsPath": "Cerebras compiler and runtime flags: weightstream has no compiler",
    "OpProfiler": "a Cerebras profiler: see weightstream's metrics.jsonl and bench/",
    "DumpActivations": "a Cerebras debugging aid",
    "HFCacheDir": "nothing is downloaded: a starting checkpoint is a local directory (ckpt_path)",
}
_REFUSED_CALLBACKS = {
    "Lora": "LoRA is not implemented",
    "SelectiveGrad": "selective gradients are not implemented",
    "WeightCompression": "weight compression is not implemented",
}
_LOGGERS = {
    "TensorBoardLogger": "weightstream writes TensorBoard events under model_dir (see Observability)",
    "WandbLogger": "Weights & Biases is not built in: metrics.jsonl and TensorBoard hold the same figures",
}


def callbacks(t: Translation, value: Any, at: str) -> None:
    if not isinstance(value, list):
        t.problems.append(Problem(at, "must be a list of {Name: {settings}}", value))
        return
    for name, settings, here in t.entries(value, at, "callback"):
        if name in _NOT_APPLICABLE_CALLBACKS:
            t.report(here, settings, _NOT_APPLICABLE_CALLBACKS[name])
        elif name in _REFUSED_CALLBACKS:
            t.problems.append(Problem(here, f"{_REFUSED_CALLBACKS[name]}; remove it"))
        elif name in ("ScopedTrainFlags", "ScopedValidateFlags"):
            section = "train_input" if name == "ScopedTrainFlags" else "eval_input"
            for flag, v in t.mapping(settings, here).items():
                if (
                    flag == "csx.performance.micro_batch_size"
                    and isinstance(v, int)
                    and not isinstance(v, bool)
                ):
                    t.put(f"{section}.micro_batch_size", v, join(here, flag))
                else:  # "auto"/"explore" or a compiler flag: weightstream picks micro-batches itself
                    t.report(
                        join(here, flag),
                        v,
                        "a Cerebras performance flag: weightstream chooses its "
                        f"micro-batches from {section}.micro_batch_size and worker_memory_mb",
                    )
        elif name == "KeepNCheckpoints":
            for key, v in t.mapping(settings, here).items():
                if key == "n":
                    t.put("runconfig.keep_checkpoint_max", v, join(here, key))
                else:
                    t.unknown(join(here, key), key, ["n"])
        elif name == "LoadCheckpointStates":
            _load_states(t, settings, here)
        else:
            known = sorted(
                [
                    *_NOT_APPLICABLE_CALLBACKS,
                    "ScopedTrainFlags",
                    "ScopedValidateFlags",
                    "KeepNCheckpoints",
                    "LoadCheckpointStates",
                ]
            )
            t.unknown(here, name, known)


def _load_states(t: Translation, settings: Any, at: str) -> None:
    """ModelZoo's LoadCheckpointStates: the legacy ``runconfig.load_checkpoint_states`` (load.py checks
    it for both layouts)."""
    for key, v in t.mapping(settings, at).items():
        if key == "load_checkpoint_states":
            t.put("runconfig.load_checkpoint_states", v, join(at, key))
        else:
            t.unknown(join(at, key), key, ["load_checkpoint_states"])


def loggers(t: Translation, value: Any, at: str) -> None:
    for name, settings, here in t.entries(value if isinstance(value, list) else [value], at, "logger"):
        if name in _LOGGERS:
            t.report(here, settings, _LOGGERS[name])
        else:
            t.unknown(here, name, sorted(_LOGGERS))

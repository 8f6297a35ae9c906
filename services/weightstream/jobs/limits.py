"""What the service accepts: bounds on a submission and on the size of a job, with sane defaults.

These are the service's, not the params': ``weightstream run`` on one's own machine has none of them, so a
user can still train a model of billions of parameters there. Both APIs reach them through
``JobService.submit`` (REST answers 422, gRPC INVALID_ARGUMENT); each problem names the key to change, the
value, the limit and the ``serve`` option that sets it.

The defaults fit this CPU appliance: 2e9 parameters are 32 GB of weights and Adam state in MemoryX; 2^20
tokens a step is 1024 sequences of GPT-2's 1024 tokens; a day is long for a numpy job.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightstream.jobs.data_roots import within
from weightstream.params import Params, Problem
from weightstream.params.size import num_layers, num_params, tokens_per_step

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_LENGTH",
    "PRIORITIES",
    "ServiceLimits",
    "apply_label_change",
    "check_labels",
    "check_params",
    "check_priority",
    "check_request",
    "check_tokens",
    "with_service_defaults",
]

PRIORITIES = (1, 2, 3)  # 1 runs before 2 before 3
MAX_LABELS = 32
MAX_LABEL_LENGTH = 256  # of a key and of a value


@dataclass(frozen=True)
class ServiceLimits:
    max_params: int = 2_000_000_000  # parameters per model
    max_layers: int = 1024  # hidden layers per model: what planning a job (and its tensor list) grows with
    max_tokens_per_step: int = 1 << 20  # batch_size x max_sequence_length (batch_size for fc_mlp)
    max_steps: int = 1_000_000  # runconfig.max_steps
    max_workers: int = 64  # num_csx, and each other kind of role (num_wgt_servers, num_act_servers)
    max_queued_jobs: int = 100  # submissions beyond it are refused with QueueFull (429) until some start
    max_job_seconds: float | None = 86_400.0  # a job's wall-clock limit over all its runs; None: none
    keep_checkpoint_max: int | None = 5  # applied when a job's params set none; None: keep all

    def __post_init__(self) -> None:
        for name in ("max_params", "max_layers", "max_tokens_per_step", "max_steps", "max_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_queued_jobs < 0:
            raise ValueError(f"max_queued_jobs must be at least 0, not {self.max_queued_jobs}")
        if self.max_job_seconds is not None and not self.max_job_seconds > 0:
            raise ValueError(f"max_job_seconds must be positive, not {self.max_job_seconds}")
        if self.keep_checkpoint_max is not None and self.keep_checkpoint_max < 1:
            raise ValueError(f"keep_checkpoint_max must be at least 1, not {self.keep_checkpoint_max}")


def _n(x: float) -> str:
    """A count as people read it: 1,048,576 below ten million, 1.2e+12 above."""
    return f"{x:,}" if x < 10_000_000 else f"{x:.2g}"


def _over(path: str, what: str, value: Any, limit: float, option: str) -> Problem:
    return Problem(path, f"{what}; this service accepts at most {_n(limit)} (serve {option})", value)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_request(
    params: Any, num_csx: Any, labels: Any, priority: Any, limits: ServiceLimits
) -> list[Problem]:
    """The submission's own fields (the params only as a whole): whatever the API, whatever its own
    schema let through."""
    problems = []
    if not isinstance(params, Mapping):
        problems.append(
            Problem("params", "must be a mapping (the params file's sections)", type(params).__name__)
        )
    if num_csx is None:  # the params' own runconfig.num_csx, checked with them (check_params)
        pass
    elif not _is_int(num_csx) or num_csx < 1:
        problems.append(Problem("num_csx", "must be an integer of at least 1", num_csx))
    elif num_csx > limits.max_workers:
        problems.append(
            _over("num_csx", "too many CS-2 workers", num_csx, limits.max_workers, "--max-workers")
        )
    return [*problems, *check_priority(priority), *check_labels(labels)]


def check_priority(priority: Any) -> list[Problem]:
    """A job's priority, at submission or changed later."""
    if not _is_int(priority) or priority not in PRIORITIES:
        return [Problem("priority", "must be 1, 2 or 3 (1 runs first)", priority)]
    return []


def check_labels(labels: Any, path: str = "labels") -> list[Problem]:
    """A job's labels, or labels to set on it (``path`` names them in the problems): how many, and the
    length of each key and value."""
    if not isinstance(labels, Mapping):
        return [Problem(path, "must be a mapping of strings to strings", labels)]
    problems = []
    if len(labels) > MAX_LABELS:
        problems.append(Problem(path, f"at most {MAX_LABELS} labels are allowed", len(labels)))
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            problems.append(Problem(f"{path}.{key}", "keys and values must be strings", value))
        elif not 0 < len(key) <= MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
            problems.append(
                Problem(
                    f"{path}.{key[:MAX_LABEL_LENGTH]}",
                    f"keys must have 1 to {MAX_LABEL_LENGTH} characters and values at most "
                    f"{MAX_LABEL_LENGTH}",
                )
            )
    return problems


def apply_label_change(
    labels: Mapping[str, str], set_: Any, remove: Any
) -> tuple[dict[str, str], list[Problem]]:
    """``labels`` with the keys of ``set_`` set and those of ``remove`` removed (a key it lacks is no
    error), and the problems of the change: the rules of a submission, on what is set and on the result."""
    problems = check_labels(set_, "set")
    if not isinstance(remove, list | tuple) or not all(isinstance(k, str) for k in remove):
        problems.append(Problem("remove", "must be a list of label keys", remove))
    if problems:
        return dict(labels), problems
    both = sorted(set(set_) & set(remove))
    if both:
        problems.append(Problem("remove", "a key cannot be both set and removed", both))
    merged = {k: v for k, v in labels.items() if k not in remove} | dict(set_)
    if len(merged) > MAX_LABELS:
        problems.append(
            Problem(
                "set", f"a job has at most {MAX_LABELS} labels; with this change it would have {len(merged)}"
            )
        )
    return merged, problems


def with_service_defaults(params: Mapping[str, Any], limits: ServiceLimits) -> dict[str, Any]:
    """Runconfig overrides the service applies where the params are silent: its checkpoint retention.
    A params file that sets ``keep_checkpoint_max`` (even to null: keep all) keeps its own choice."""
    rc = params.get("runconfig")
    if limits.keep_checkpoint_max is None or (isinstance(rc, Mapping) and "keep_checkpoint_max" in rc):
        return {}
    trainer = params.get("trainer")
    init = trainer.get("init") if isinstance(trainer, Mapping) else None
    callbacks = init.get("callbacks") if isinstance(init, Mapping) else None
    if isinstance(callbacks, list) and any(
        isinstance(c, Mapping) and "KeepNCheckpoints" in c for c in callbacks
    ):
        return {}  # the trainer: layout's spelling of keep_checkpoint_max
    return {"keep_checkpoint_max": limits.keep_checkpoint_max}


def check_params(p: Params, limits: ServiceLimits) -> list[Problem]:
    """Bounds on the size of a job whose params are valid. Counts only: nothing is built or allocated."""
    problems = []
    m, rc = p.model, p.runconfig
    layers_key = "model.num_hidden_layers" if m.name != "fc_mlp" else "model.depth"
    if num_layers(m) > limits.max_layers:
        problems.append(
            _over(
                layers_key,
                f"the model has {_n(num_layers(m))} layers",
                num_layers(m),
                limits.max_layers,
                "--max-layers",
            )
        )
    n = num_params(m)
    if n > limits.max_params:
        # hidden_size enters every term of both families' counts: it is the key that always helps
        problems.append(
            _over(
                "model.hidden_size",
                f"the model has {_n(n)} parameters",
                m.hidden_size,
                limits.max_params,
                "--max-params",
            )
        )
    problems += check_tokens(p, limits)
    if rc.max_steps > limits.max_steps:
        problems.append(
            _over("runconfig.max_steps", "too many steps", rc.max_steps, limits.max_steps, "--max-steps")
        )
    for key, what in (
        ("num_csx", "CS-2 workers"),
        ("num_wgt_servers", "servers"),
        ("num_act_servers", "servers"),
    ):
        count = getattr(rc, key)
        if count > limits.max_workers:
            problems.append(
                _over(f"runconfig.{key}", f"too many {what}", count, limits.max_workers, "--max-workers")
            )
    if limits.max_job_seconds is not None and rc.rpc_timeout_s > limits.max_job_seconds:
        # the limit is checked between steps: one hung call must not outlive it by more than a call's deadline
        problems.append(
            _over(
                "runconfig.rpc_timeout_s",
                "a call's deadline must fit in a job's time limit",
                rc.rpc_timeout_s,
                limits.max_job_seconds,
                "--max-job-seconds",
            )
        )
    if rc.memoryx_dir is not None and not _inside(Path(rc.model_dir), rc.memoryx_dir):
        # the shards empty and delete their directory there: it must be the job's own
        problems.append(
            Problem(
                "runconfig.memoryx_dir",
                "must lie inside the job's own directory (a relative path, taken from model_dir)",
                rc.memoryx_dir,
            )
        )
    return problems


def check_tokens(
    p: Params, limits: ServiceLimits, sections: Iterable[str] = ("train_input", "eval_input")
) -> list[Problem]:
    """The tokens a step of each input of ``sections`` trains on, within the limit. An input whose
    ``max_sequence_length`` is left out counts 1 a sample (``tokens_per_step``) until its files have said
    how long a sample is."""
    problems = []
    m = p.model
    for sec in sections:
        inp = getattr(p, sec)
        if inp is None:
            continue
        tokens = tokens_per_step(inp, m)
        if tokens > limits.max_tokens_per_step:
            shape = "batch_size x max_sequence_length" if m.name != "fc_mlp" else "batch_size"
            problems.append(
                _over(
                    f"{sec}.batch_size",
                    f"a step has {_n(tokens)} tokens ({shape})",
                    inp.batch_size,
                    limits.max_tokens_per_step,
                    "--max-tokens-per-step",
                )
            )
    return problems


def _inside(root: Path, path: str) -> bool:
    """``path`` (relative to ``root``, or absolute) lies strictly under ``root``, every link followed."""
    if "\0" in path:  # names no path at all (realpath would raise)
        return False
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, path))  # an absolute path replaces root
    return real != real_root and within(real, real_root)

"""ModelZoo keys that change nothing here: accepted, and reported as not applicable with the reason.

The rule of the params boundary: a key is an error only where ignoring it would change what trains. These
are the keys whose every value (or every value ``harmless`` admits) leaves training as it is: hardware
and compiler knobs, DataLoader knobs, fp16 loss-scale settings, logging switches. A value outside
``harmless`` would change results and is refused with the same reason. Keys that are refused whatever
their value are in ``modelzoo.UNSUPPORTED``. Paths are in the legacy layout; a ``trainer:`` file's keys
are translated first (``trainer_layout.py``), so one table serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["NOT_APPLICABLE", "Rule"]


def _any(_: Any) -> bool:
    return True


def _falsy(v: Any) -> bool:
    return not v


def _zero(v: Any) -> bool:
    return v in (0, 0.0, None, False)


def _one_of(*values: Any) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return (v.lower() if isinstance(v, str) else v) in values

    return check


@dataclass(frozen=True)
class Rule:
    reason: str
    harmless: Callable[[Any], bool] = _any  # the values that change nothing; any other is refused


_LOADER = Rule("a PyTorch DataLoader knob: weightstream's activation servers read the data themselves")
_LOSS_SCALE = Rule("fp16 loss scaling: weightstream's gradients are fp32 (bfloat16 needs no loss scale)")
_COMPILER = Rule("a Cerebras compiler or runtime setting: weightstream has no compiler")
_POD_MEMORY = Rule(
    "memory a Cerebras cluster reserves for a job's pods: weightstream sizes each role's memory from "
    "the model's plan"
)
_LOGGING = Rule("what ModelZoo logs: weightstream logs loss, gradient norm and throughput every log_steps")

NOT_APPLICABLE: dict[str, dict[str, Rule]] = {
    "train_input": {
        "prefetch_factor": _LOADER,
        "persistent_workers": _LOADER,
        "use_worker_index": _LOADER,
        "pin_memory": _LOADER,
        # ModelZoo's HDF5 processors take the vocabulary from the model; weightstream checks every id
        "vocab_size": Rule("token ids are checked against model.vocab_size"),
        "mixed_precision": Rule("precision is model.fp16_type (or trainer.init.precision)"),
        "repeat": Rule("the data repeats as many times as max_steps needs", lambda v: v in (True, None)),
    },
    "model": {
        "precision_opt_level": _COMPILER,
        "boundary_casting": _COMPILER,
        "fold_rope_consts": _COMPILER,
        "tf_summary": _LOGGING,
        "attention_softmax_fp32": Rule("softmax is computed in fp32", lambda v: v in (True, None)),
        "label_smoothing": Rule("label smoothing is not implemented: only 0", _zero),
        "compute_eval_metrics": Rule("evaluation reports the loss (and perplexity) only", _falsy),
        # ModelZoo's default; true adds a LayerNorm Hugging Face's GPT-2 and LLaMA do not have
        "embedding_layer_norm": Rule(
            "an embedding LayerNorm is not in Hugging Face's GPT2LMHeadModel or LlamaForCausalLM, which "
            "weightstream's checkpoints load into: only false",
            _falsy,
        ),
        "use_position_embedding": Rule(
            "position embeddings are always used (learned for gpt2/gpt3, rotary for llama): only true",
            lambda v: v is True,
        ),
    },
    "optimizer": {
        "loss_scaling_factor": _LOSS_SCALE,
        "initial_loss_scale": _LOSS_SCALE,
        "steps_per_increase": _LOSS_SCALE,
        "min_loss_scale": _LOSS_SCALE,
        "max_loss_scale": _LOSS_SCALE,
        "log_summaries": Rule("the gradient norm is logged every log_steps anyway (metrics.jsonl)"),
        "ws_summary": _LOGGING,
        "grad_accum_steps": Rule(
            "gradients accumulate over micro-batches: set train_input.micro_batch_size",
            lambda v: v in (1, None),
        ),
    },
    "runconfig": {
        "mode": Rule(
            "weightstream trains, and evaluates when eval_input is given",
            _one_of("train", "train_and_eval"),
        ),
        "target_device": Rule("weightstream is its own device (CS-2 workers in numpy)"),
        "precision_opt_level": _COMPILER,
        "compile_dir": _COMPILER,
        "compile_only": Rule(
            "weightstream has no compile step; `weightstream validate` checks a file", _falsy
        ),
        "validate_only": Rule("use `weightstream validate`", _falsy),
        "num_workers_per_csx": Rule("one worker process per CS-2"),
        "enable_distributed": Rule("a GPU setting: weightstream's roles are its own processes"),
        "dist_backend": Rule("a GPU setting: weightstream's roles are its own processes"),
        "init_method": Rule("a GPU setting: weightstream's roles are its own processes"),
        "sync_batchnorm": Rule("a GPU setting: weightstream's roles are its own processes"),
        "main_process_id": Rule("a GPU setting: weightstream's roles are its own processes"),
        "log_input_summaries": _LOGGING,
        "show_debug_metrics": _LOGGING,
        "save_losses": Rule("metrics.jsonl in model_dir holds every logged loss"),
        "log_level": _LOGGING,
        "logging": _LOGGING,
        "wsc_log_level": _LOGGING,
        "enable_act_frequency": _LOGGING,
        "check_loss_values": Rule("a run stops on a non-finite loss anyway (see Faults)"),
        "disable_strict_checkpoint_loading": Rule(
            "a starting checkpoint is checked tensor by tensor against the model, and a mismatch is an error"
        ),
        "mgmt_address": _COMPILER,
        "mgmt_namespace": _COMPILER,
        "credentials_path": _COMPILER,
        "mount_dirs": _COMPILER,
        "python_paths": _COMPILER,
        "cbcore_image": _COMPILER,
        "job_labels": Rule("label a service job with `wsctl label`"),
        "job_priority": Rule("set a service job's priority at submission (`--priority`)"),
        "job_time_sec": _COMPILER,
        "disable_version_check": _COMPILER,
        "compile_crd_memory_gi": _POD_MEMORY,
        "execute_crd_memory_gi": _POD_MEMORY,
        "wrk_memory_gi": _POD_MEMORY,
        "act_memory_gi": _POD_MEMORY,
        "cmd_memory_gi": _POD_MEMORY,
        "summary_dir": Rule("TensorBoard events are written under model_dir"),
    },
}
NOT_APPLICABLE["eval_input"] = NOT_APPLICABLE["train_input"]

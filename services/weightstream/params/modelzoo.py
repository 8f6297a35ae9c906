"""Keys that legacy ModelZoo params files use and weightstream does not implement.

They are rejected by name, never silently ignored, each with the reason or what to use instead.
Section "" is the top level of the file.
"""

from __future__ import annotations

__all__ = ["UNSUPPORTED"]

_LOADER = "a PyTorch DataLoader knob; weightstream's activation servers do not use it"
# keys a model family declares itself are not these (load.py): rotary_dim is llama's own, gpt2's unsupported
_LEARNED = "gpt2 uses learned position embeddings; rotary embeddings are model.name: llama"
_MHA = "gpt2 uses multi-head attention; grouped-query attention is model.name: llama"
UNSUPPORTED: dict[str, dict[str, str]] = {
    "sparsity": {
        "schedule": "dynamic sparsity (algorithm: gmp) is not implemented; only algorithm: static",
        "update": "dynamic sparsity (algorithm: gmp) is not implemented; only algorithm: static",
    },
    "train_input": {
        "prefetch_factor": _LOADER,
        "persistent_workers": _LOADER,
        "use_worker_index": _LOADER,
        "vocab_file": "tokenize with `weightstream data-preprocess`, read with GptHDF5MapDataProcessor",
        "mixed_precision": "use model.fp16_type",
        "repeat": "the data repeats as many times as max_steps needs",
    },
    "model": {
        "mixed_precision": "use model.fp16_type: bfloat16",
        "precision_opt_level": "not applicable",
        "boundary_casting": "not applicable",
        "tf_summary": "not applicable",
        "rotary_dim": _LEARNED,
        "rope_theta": _LEARNED,
        "alibi_trainable_slopes": "ALiBi is not implemented",
        "num_relative_attention_buckets": "relative position buckets are not implemented",
        "embeddings_scale": "GPT-2 does not scale embeddings",
        "scale_qk_dot_by_d": "GPT-2 scales by 1/sqrt(d)",
        "attention_softmax_fp32": "softmax is always computed in fp32",
        "fixed_sparse_attention": "sparse attention is not implemented",
        "attention_module": _MHA,
        "extra_attention_params": _MHA,
        "embedding_initializer": "use model.initializer_range",
        "initializer": "use model.initializer_range",
        "output_layer_initializer": "use model.initializer_range",
        "loss_weight": "the loss is the mean over tokens (loss_scaling: num_tokens)",
        "label_smoothing": "not implemented",
        "compute_eval_metrics": "eval reports the loss only",
    },
    "optimizer": {
        "loss_scaling_factor": "loss scaling is not needed: training runs in fp32",
        "initial_loss_scale": "loss scaling is not needed",
        "steps_per_increase": "loss scaling is not needed",
        "min_loss_scale": "loss scaling is not needed",
        "max_loss_scale": "loss scaling is not needed",
        "max_gradient_value": "clipping by value is not implemented; use max_gradient_norm",
        "log_summaries": "not applicable",
        "adjust_learning_rate": "per-parameter learning rates are not implemented",
        "dampening": "not implemented",
    },
    "runconfig": {
        "mode": "weightstream trains; evaluation runs when eval_input is given",
        "precision_opt_level": "not applicable",
        "num_workers_per_csx": "one worker process per CS-2",
        "compile_only": "not applicable",
        "validate_only": "use `weightstream validate`",
        "enable_distributed": "not applicable",
        "dist_backend": "not applicable",
        "init_method": "not applicable",
        "sync_batchnorm": "not applicable",
        "log_input_summaries": "not applicable",
    },
}
UNSUPPORTED["eval_input"] = UNSUPPORTED["train_input"]

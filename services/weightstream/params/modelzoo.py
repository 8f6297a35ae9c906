"""Keys that ModelZoo params files use and weightstream refuses: ignoring them would change what trains.

They are rejected by name, never silently ignored, each with the reason or what to use instead (keys
that change nothing here are in ``not_applicable.py``).
Section "" is the top level of the file.
"""

from __future__ import annotations

__all__ = ["UNSUPPORTED"]

# keys a model family declares itself are not these (load.py): rotary_dim is llama's own, gpt2's unsupported
_LEARNED = "gpt2 uses learned position embeddings; rotary embeddings are model.name: llama"
_MUP = "muP (maximal update parametrization) is not implemented"
_MHA = "gpt2 uses multi-head attention; grouped-query attention is model.name: llama"
UNSUPPORTED: dict[str, dict[str, str]] = {
    "sparsity": {
        "drop_fraction": "dynamic sparsity set and rigl are not implemented; algorithm static and gmp are",
    },
    "train_input": {
        "vocab_file": "tokenize with `weightstream data-preprocess`, read with GptHDF5MapDataProcessor",
        "data_transforms": "data transforms (attention sink tokens) are not implemented",
    },
    "model": {
        "rotary_dim": _LEARNED,
        "rope_theta": _LEARNED,
        "alibi_trainable_slopes": "ALiBi is not implemented",
        "num_relative_attention_buckets": "relative position buckets are not implemented",
        "embeddings_scale": "GPT-2 does not scale embeddings",
        "scale_qk_dot_by_d": "GPT-2 scales by 1/sqrt(d)",
        "fixed_sparse_attention": "sparse attention is not implemented",
        "attention_sliding_window_length": "sliding-window attention is not implemented",
        "attention_sink_tokens": "attention sinks are not implemented",
        "mup_base_hidden_size": _MUP,
        "mup_base_filter_size": _MUP,
        "output_logits_alpha": _MUP,
        "output_logits_scale": _MUP,
        "moe_params": "mixture of experts is not implemented",
        "ffn_initializer": "not implemented: initializer covers the MLP layers",
        "ffn_output_layer_initializer": "not implemented: output_layer_initializer covers the last MLP layer",
        "lora_params": "LoRA is not implemented",
        "selective_grad": "selective gradients are not implemented",
        "compression": "weight compression is not implemented",
        "attention_module": _MHA,
        "extra_attention_params": _MHA,
    },
    "optimizer": {
        "max_gradient_value": "clipping by value is not implemented; use max_gradient_norm",
        "adjust_learning_rate": "per-parameter learning rates are not implemented",
        "dampening": "not implemented",
    },
}
UNSUPPORTED["eval_input"] = UNSUPPORTED["train_input"]

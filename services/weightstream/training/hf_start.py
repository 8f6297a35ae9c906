"""Starting a run from a Hugging Face model (``runconfig.checkpoint_path`` or ``--checkpoint_path``): the
directory checked against the params before any role starts.

Everything that changes the function the model computes must agree (sizes, vocabulary, heads and kv
groups, tied embeddings, the nonlinearity, RoPE, norm epsilon): a mismatch is an error naming the
config key, its value there and what the params give. So must every tensor's name and shape. Settings
that only matter in training (dropout, the initializer) come from the params, with a note. A key that
``save_pretrained`` left out of config.json has transformers' default, listed here.

The weights load tensor by tensor inside the MemoryX shards (``hf_checkpoint.start_tensors``); the
optimizer state and the step start fresh (ModelZoo's ``load_checkpoint_states: model``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weightstream.hf_checkpoint import StartCheckpointError, read_config, stored_names, tensor_shapes
from weightstream.numerics import ModelDef
from weightstream.numerics.rope_scaling import describe_rope_scaling, rope_from_hf_config
from weightstream.params import Params
from weightstream.training.checkpoints import hf_config

__all__ = ["check_start_checkpoint"]

# transformers' defaults for what a config.json may leave out (GPT2Config, LlamaConfig)
_GPT2: dict[str, Any] = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
}
_LLAMA: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": None,
}
_TRAINING_ONLY = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "initializer_range"}


def check_start_checkpoint(params: Params, model: ModelDef, path: str | Path) -> list[str]:
    """Notes for the run log; StartCheckpointError listing every mismatch."""
    d = Path(path)
    theirs = read_config(d)
    ours = hf_config(params)
    family = ours["model_type"] if model.family != "fc_mlp" else None
    if family is None:
        raise StartCheckpointError("starting from a Hugging Face checkpoint works for gpt2 and llama models")
    if theirs.get("model_type") != family:
        raise StartCheckpointError(
            f"{d}: config.json's model_type is {theirs.get('model_type')!r}, the params' model is {family!r}"
        )
    problems = _config_problems(theirs, ours, family)
    found, extra = stored_names(d, list(model.specs))
    missing = [n for n in model.specs if n not in found]
    if missing:
        problems.append(f"tensors the model needs are not in {d}: {', '.join(missing[:5])}")
    if extra:
        problems.append(f"tensors in {d} that this model does not have: {', '.join(extra[:5])}")
    for n, shape in tensor_shapes(d, found).items():
        if shape != model.specs[n].shape:
            problems.append(
                f"{n}: shape {list(shape)} in the checkpoint, {list(model.specs[n].shape)} in the params"
            )
    if problems:
        raise StartCheckpointError(
            f"{d} cannot start this run ({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    notes = [f"starting from {d}: {len(found)} tensors; optimizer state and step start fresh"]
    differ = [k for k in sorted(_TRAINING_ONLY) if k in theirs and k in ours and theirs[k] != ours[k]]
    if differ:
        notes.append("training settings from the params, not config.json: " + ", ".join(differ))
    return notes


def _config_problems(theirs: dict[str, Any], ours: dict[str, Any], family: str) -> list[str]:
    defaults = _GPT2 if family == "gpt2" else _LLAMA
    got = {k: theirs.get(k, v) for k, v in defaults.items()}
    want = {k: ours.get(k, v) for k, v in defaults.items()}
    problems: list[str] = []
    if family == "gpt2":  # n_inner None means 4 * n_embd
        got["n_inner"] = got["n_inner"] or 4 * got["n_embd"]
    else:
        got["num_key_value_heads"] = got["num_key_value_heads"] or got["num_attention_heads"]
        got["head_dim"] = got["head_dim"] or got["hidden_size"] // got["num_attention_heads"]
        try:  # as transformers reads it: rope_scaling, else rope_parameters, else rope_theta alone
            got["rope_theta"], their_scaling = rope_from_hf_config(theirs)
        except ValueError as e:
            return [f"config.json: {e}"]
        want["rope_theta"], our_scaling = rope_from_hf_config(ours)
        if their_scaling != our_scaling:
            problems.append(
                f"config.json's RoPE scaling is {describe_rope_scaling(their_scaling)}, the params give "
                f"{describe_rope_scaling(our_scaling)} (model.pos_scaling_type, pos_scaling_factor, "
                "pos_scaling_extra_args)"
            )
    return [
        f"config.json {k} = {got[k]!r}, the params give {want[k]!r}" for k in got if got[k] != want[k]
    ] + problems

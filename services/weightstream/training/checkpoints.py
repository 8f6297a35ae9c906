"""Finishing a checkpoint that the MemoryX shards have written: index, config.json, trainer state, rename.

A checkpoint is written into ``.checkpoint_<step>.partial/``; once every shard's files and the index,
config and trainer state are in and fsynced, the directory is renamed to ``checkpoint_<step>``. A crash
at any point leaves either a complete ``checkpoint_<step>`` or a ``.partial`` one that is never loaded.

Retention (``runconfig.keep_checkpoint_max``) removes old checkpoints the other way round: renamed aside
to ``.checkpoint_<step>.deleting`` first (no longer complete, so never loaded), then deleted; a crash in
between leaves a ``.deleting`` directory that the next pass removes.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weightstream.checkpoint_layout import (
    MASKS,
    TRAINER_STATE,
    checkpoint_dir,
    complete_checkpoints,
    partial_dir_path,
    recovery_snapshots,
)
from weightstream.numerics.rope_scaling import hf_rope_config
from weightstream.params import Params
from weightstream.params.resolve import rope_scaling
from weightstream.params.schema import GPT2ModelParams, LlamaModelParams, RunConfig
from weightstream.proto import weightstream_pb2 as pb
from weightstream.storage_io import fsync_dir, write_text_durably
from weightstream.training.errors import JobFailed

__all__ = [
    "finish_checkpoint",
    "hf_config",
    "partial_dir",
    "prune_checkpoints",
    "refuse_weights_only",
    "remove_recovery_snapshots",
    "trainer_state",
    "trim_metrics",
    "written_files",
]

_DELETING = re.compile(r"^\.checkpoint_\d+\.deleting$")


def partial_dir(model_dir: Path, step: int) -> Path:
    """A fresh, empty directory for checkpoint ``step`` to be written into."""
    d = partial_dir_path(model_dir, step)
    if d.exists():
        shutil.rmtree(d)  # left over by a crash: never complete, never loaded
    d.mkdir(parents=True)
    return d


def hf_config(params: Params) -> dict[str, Any]:
    """config.json: Hugging Face's GPT2Config or LlamaConfig (so from_pretrained works), ours for fc_mlp."""
    m = params.model
    if isinstance(m, GPT2ModelParams):
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": m.vocab_size,
            "n_positions": m.max_position_embeddings,
            "n_embd": m.hidden_size,
            "n_layer": m.num_hidden_layers,
            "n_head": m.num_heads,
            "n_inner": m.inner_size,
            "activation_function": m.nonlinearity,  # gelu: erf; gelu_new: tanh (as weightstream computed)
            "layer_norm_epsilon": m.layer_norm_epsilon,
            "initializer_range": m.initializer_range,
            "resid_pdrop": m.dropout_rate,  # what the model trained with, for whoever trains it on
            "embd_pdrop": m.embedding_dropout,
            "attn_pdrop": m.attention_dropout,
            "scale_attn_weights": True,
            "tie_word_embeddings": m.share_embedding_weights,
            "bos_token_id": None,
            "eos_token_id": None,  # byte and synthetic tokens have no special ids
            "torch_dtype": "float32",
        }
    if isinstance(m, LlamaModelParams):
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size,
            "intermediate_size": m.inner_size,
            "num_hidden_layers": m.num_hidden_layers,
            "num_attention_heads": m.num_heads,
            "num_key_value_heads": m.num_kv_heads,
            "head_dim": m.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": m.max_position_embeddings,
            "initializer_range": m.initializer_range,
            "rms_norm_eps": m.layer_norm_epsilon,
            # transformers < 5 reads rope_theta (+ rope_scaling), 5 rope_parameters: both, so either loads it
            **hf_rope_config(m.rope_theta, rope_scaling(m)),
            "attention_bias": m.use_projection_bias_in_attention,
            "attention_dropout": 0.0,
            "mlp_bias": m.use_ffn_bias,
            "tie_word_embeddings": m.share_embedding_weights,
            "bos_token_id": None,
            "eos_token_id": None,
            "torch_dtype": "float32",
        }
    return {"model_type": "weightstream_fc_mlp", **m.model_dump(mode="json")}


def written_files(replies: Sequence[pb.CheckpointReply]) -> dict[str, list[tuple[str, list[str]]]]:
    """The files every shard wrote (their ``SaveCheckpoint`` replies), by prefix: "model", "optimizer"
    and, where the model is sparse, the masks'; each as (file, the tensors in it)."""
    files = {
        "model": [(f.name, list(f.tensors)) for r in replies for f in r.model_files],
        "optimizer": [(f.name, list(f.tensors)) for r in replies for f in r.optimizer_files],
        MASKS: [(f.name, list(f.tensors)) for r in replies for f in r.mask_files],
    }
    if not files[MASKS]:
        del files[MASKS]
    return files


def trainer_state(rc: RunConfig, optimizer_type: str, weights_only: bool) -> dict[str, Any]:
    """What a checkpoint's trainer state says of the run beside its step: its layout and seed, its
    optimizer, and whether the optimizer state is in it (resumable) or not."""
    state: dict[str, Any] = {
        "num_csx": rc.num_csx,
        "num_wgt_servers": rc.num_wgt_servers,
        "seed": rc.seed,
        "optimizer_type": optimizer_type,
        "weightstream_format": 1,
        "optimizer_state": not weights_only,
    }
    if weights_only:
        state["note"] = "weights only (checkpoint_optimizer_state: false): loadable, not resumable"
    return state


def finish_checkpoint(
    model_dir: Path,
    tmp: Path,
    step: int,
    params: Params,
    files: dict[str, list[tuple[str, list[str]]]],
    trainer_state: dict[str, Any],
    final: Path | None = None,
) -> Path:
    """Write index, config and trainer state into ``tmp`` and rename it to ``final`` (by default
    ``checkpoint_<step>``; a recovery snapshot goes to ``.recovery_<step>``, without config.json).
    ``files`` maps "model" and "optimizer" to the (file, tensor names) the shards wrote; a prefix with
    more than one file gets Hugging Face's index."""
    for prefix, written in files.items():
        if len(written) > 1:
            weight_map = {n: f for f, names in written for n in names}
            size = sum((tmp / f).stat().st_size for f, _ in written)
            index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
            write_text_durably(tmp / f"{prefix}.safetensors.index.json", json.dumps(index, indent=2))
    if final is None:
        write_text_durably(tmp / "config.json", json.dumps(hf_config(params), indent=2))
    # written last, and like every durable write it fsyncs its directory: tmp's entries are all on disk
    write_text_durably(tmp / TRAINER_STATE, json.dumps({"global_step": step, **trainer_state}, indent=2))
    final = final or checkpoint_dir(model_dir, step)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    fsync_dir(model_dir)
    return final


def refuse_weights_only(path: Path) -> None:
    """Raise JobFailed if checkpoint ``path`` holds no optimizer state: it loads, but cannot resume a run."""
    state = json.loads((path / TRAINER_STATE).read_text())
    if state.get("optimizer_state", True) is False:
        raise JobFailed(
            f"{path} holds the weights only (written with checkpoint_optimizer_state: false), so a run "
            "cannot resume from it; set runconfig.autoload_last_checkpoint: false, or use a new model_dir"
        )


def prune_checkpoints(
    model_dir: Path, keep_max: int | None, just_written: Path, log: logging.Logger | None = None
) -> list[int]:
    """Delete complete checkpoints beyond the newest ``keep_max`` (by step), oldest first, never
    ``just_written`` (a run restarted from scratch writes below the steps of an earlier run's
    checkpoints). ``keep_max`` None keeps every checkpoint. Returns the steps removed."""
    for leftover in [d for d in model_dir.iterdir() if _DELETING.match(d.name)]:  # a crash mid-delete
        shutil.rmtree(leftover, ignore_errors=True)
    if keep_max is None:
        return []
    complete = complete_checkpoints(model_dir)  # by step, oldest first
    newest = {d for _, d in complete[-keep_max:]} | {just_written}
    removed = []
    for step, d in complete:
        if d in newest:
            continue
        aside = model_dir / f".checkpoint_{step}.deleting"
        d.rename(aside)  # atomic: from here on the checkpoint is not complete, so never resumed from
        fsync_dir(model_dir)
        shutil.rmtree(aside)
        removed.append(step)
        if log is not None:
            log.info("removed checkpoint %s (runconfig.keep_checkpoint_max %d)", d, keep_max)
    return removed


def remove_recovery_snapshots(model_dir: Path, keep: Path | None = None) -> None:
    """Delete the recovery snapshots in ``model_dir`` but ``keep``: they are scratch, for the run that
    wrote them (a new run resumes from checkpoints only)."""
    for _, d in recovery_snapshots(model_dir):
        if d != keep:
            shutil.rmtree(d, ignore_errors=True)


def trim_metrics(path: Path, step: int) -> int:
    """Drop the records of steps after ``step`` from ``metrics.jsonl`` (a run resuming from checkpoint
    ``step`` does those steps again, and logs them again). Returns how many records were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            record_step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            record_step = 0  # a torn last line of a crash: keep it out only if it is past the step
            if not line.endswith("\n"):
                continue
        if record_step <= step:
            kept.append(line)
    if len(kept) != len(lines):
        write_text_durably(path, "".join(kept))
    return len(lines) - len(kept)

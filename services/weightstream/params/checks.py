"""Checks that relate keys of different sections (batch size vs num_csx and min_num_csx, sequence length
vs positions, data processor vs model), each problem carrying the path of the key a user has to change."""

from __future__ import annotations

from weightstream.params.errors import Problem
from weightstream.params.resolve import model_def
from weightstream.params.schema import (
    FCMLPModelParams,
    InputParams,
    LanguageModelParams,
    LlamaModelParams,
    OptimizerParams,
    Params,
    RunConfig,
)
from weightstream.params.size import num_params
from weightstream.params.sparsity import sparsity_problems

__all__ = ["cross_check"]


def cross_check(p: Params) -> list[Problem]:
    """Checks that relate keys of different sections."""
    problems: list[Problem] = []
    rc, m = p.runconfig, p.model
    inputs = [("train_input", p.train_input)] + ([("eval_input", p.eval_input)] if p.eval_input else [])
    if rc.min_num_csx is not None and rc.min_num_csx > rc.num_csx:
        problems.append(
            Problem(
                "runconfig.min_num_csx",
                f"must be at most runconfig.num_csx={rc.num_csx} (the fewest workers the job may go on with)",
                rc.min_num_csx,
            )
        )
    for sec, inp in inputs:
        problems += _check_batch_split(sec, inp, rc)
        problems += _check_data_source(sec, inp)
        problems += _check_input_vs_model(sec, inp, m)
    if rc.execution_mode == "pipelined" and rc.worker_memory_mb is not None:
        model_mb = num_params(p.model) * 4 / 2**20  # closed form: builds nothing
        if model_mb > rc.worker_memory_mb:
            problems.append(
                Problem(
                    "runconfig.execution_mode",
                    f"pipelined keeps the whole model ({model_mb:.1f} MiB) on each worker, more than "
                    f"worker_memory_mb={rc.worker_memory_mb}; use weight_streaming or auto",
                    "pipelined",
                )
            )
    if rc.eval_frequency and p.eval_input is None:
        problems.append(Problem("runconfig.eval_frequency", "needs an eval_input section", rc.eval_frequency))
    n_units = (m.num_hidden_layers + 2) if isinstance(m, LanguageModelParams) else (m.depth + 1)
    if rc.num_wgt_servers > n_units:
        problems.append(
            Problem(
                "runconfig.num_wgt_servers",
                f"must be at most the model's {n_units} streamable "
                "units (whole units are assigned to weight servers)",
                rc.num_wgt_servers,
            )
        )
    if isinstance(m, LanguageModelParams) and m.hidden_size % m.num_heads:
        problems.append(
            Problem("model.hidden_size", f"must be divisible by model.num_heads={m.num_heads}", m.hidden_size)
        )
    if isinstance(m, LlamaModelParams):
        problems += _check_llama(m)
    if p.sparsity is not None and not problems:  # the model must be buildable to resolve the globs
        problems += sparsity_problems(p, model_def(p))
    return problems + _check_optimizer(p.optimizer)


def _check_batch_split(sec: str, inp: InputParams, rc: RunConfig) -> list[Problem]:
    """The global batch, and each worker's shard of it in micro-batches, split evenly at ``num_csx``
    workers and at every count the job may shrink to (``runconfig.min_num_csx``): one problem per key,
    naming the first count that fails."""
    problems = []
    if inp.batch_size % rc.num_csx:
        problems.append(
            Problem(
                f"{sec}.batch_size",
                f"must be divisible by runconfig.num_csx={rc.num_csx} "
                "(the global batch is split evenly across CS-2 workers)",
                inp.batch_size,
            )
        )
    elif bad := [n for n in rc.worker_counts if inp.batch_size % n]:
        problems.append(
            Problem(
                f"{sec}.batch_size",
                f"must be divisible by every worker count from runconfig.min_num_csx={rc.min_num_csx} to "
                f"num_csx={rc.num_csx} (a job that loses workers goes on with fewer, the global batch "
                f"split evenly across them), and {bad[0]} does not divide it",
                inp.batch_size,
            )
        )
    if problems or inp.micro_batch_size is None:
        return problems
    for n in (rc.num_csx, *rc.worker_counts):
        shard = inp.batch_size // n
        if shard % inp.micro_batch_size:
            at = (
                f"num_csx {n}" if n == rc.num_csx else f"{n} workers (runconfig.min_num_csx={rc.min_num_csx})"
            )
            return [
                Problem(
                    f"{sec}.micro_batch_size",
                    f"must divide the per-worker shard of {shard} samples "
                    f"(batch_size {inp.batch_size} / {at})",
                    inp.micro_batch_size,
                )
            ]
    return []


def _check_data_source(sec: str, inp: InputParams) -> list[Problem]:
    """Where the files come from: data_dir, or (GptHDF5MapDataProcessor only) a mixture of directories."""
    dp = inp.data_processor
    if inp.mixture is not None and dp != "GptHDF5MapDataProcessor":
        return [Problem(f"{sec}.mixture", f"applies to GptHDF5MapDataProcessor only, not {dp}")]
    if inp.mixture is not None and inp.data_dir:
        return [Problem(f"{sec}.mixture", "and data_dir exclude each other: give one of them")]
    if dp == "GptHDF5MapDataProcessor" and not inp.data_dir and inp.mixture is None:
        return [Problem(f"{sec}.data_dir", f"is required by {dp} (or a mixture: [{{data_dir, weight}}])")]
    if dp in ("TextFileDataProcessor", "TokenFileDataProcessor") and not inp.data_dir:
        return [Problem(f"{sec}.data_dir", f"is required by {dp}")]
    return []


def _check_llama(m: LlamaModelParams) -> list[Problem]:
    problems = []
    if m.use_projection_bias_in_attention != m.use_ffn_bias_in_attention:
        problems.append(
            Problem(
                "model.use_ffn_bias_in_attention",
                "must equal model.use_projection_bias_in_attention: LlamaForCausalLM's attention_bias "
                "puts a bias on q, k, v and o alike",
                m.use_ffn_bias_in_attention,
            )
        )
    if m.attention_module == "aiayn_attention" and m.extra_attention_params is not None:
        problems.append(
            Problem(
                "model.extra_attention_params",
                "applies to attention_module: multiquery_attention (grouped-query attention)",
            )
        )
    if m.num_heads % m.num_kv_heads:
        problems.append(
            Problem(
                "model.extra_attention_params.num_kv_groups",
                f"must divide model.num_heads={m.num_heads}",
                m.num_kv_heads,
            )
        )
    if m.hidden_size % m.num_heads == 0:
        if m.head_dim % 2:
            problems.append(
                Problem(
                    "model.num_heads",
                    f"must leave an even head size for rotary embeddings (hidden_size / num_heads = "
                    f"{m.head_dim})",
                    m.num_heads,
                )
            )
        if m.rotary_dim is not None and m.rotary_dim != m.head_dim:
            problems.append(
                Problem(
                    "model.rotary_dim",
                    f"must be the head size {m.head_dim} (hidden_size / num_heads): LlamaForCausalLM rotates "
                    "whole heads",
                    m.rotary_dim,
                )
            )
    return problems


def _check_input_vs_model(
    sec: str, inp: InputParams, m: LanguageModelParams | FCMLPModelParams
) -> list[Problem]:
    problems = []
    dp = inp.data_processor
    if isinstance(m, LanguageModelParams):
        if dp == "DigitsDataProcessor":
            problems.append(
                Problem(
                    f"{sec}.data_processor",
                    f"DigitsDataProcessor feeds fc_mlp models; {m.name} takes GptHDF5MapDataProcessor, "
                    "TextFileDataProcessor, TokenFileDataProcessor or SyntheticDataProcessor",
                    dp,
                )
            )
        if inp.max_sequence_length is None:
            if dp != "GptHDF5MapDataProcessor":  # HDF5 files say it (data/sequence_length.py)
                problems.append(Problem(f"{sec}.max_sequence_length", f"is required for {m.name}"))
        elif inp.max_sequence_length > m.max_position_embeddings:
            problems.append(
                Problem(
                    f"{sec}.max_sequence_length",
                    f"must be at most model.max_position_embeddings={m.max_position_embeddings}",
                    inp.max_sequence_length,
                )
            )
        if dp == "TextFileDataProcessor" and m.vocab_size < 256:
            problems.append(
                Problem(
                    "model.vocab_size",
                    "must be at least 256 for TextFileDataProcessor (byte-level tokens)",
                    m.vocab_size,
                )
            )
    else:
        if dp in ("TextFileDataProcessor", "TokenFileDataProcessor", "GptHDF5MapDataProcessor"):
            problems.append(
                Problem(
                    f"{sec}.data_processor",
                    f"{dp} feeds language models (gpt2, llama); fc_mlp takes DigitsDataProcessor or "
                    "SyntheticDataProcessor",
                    dp,
                )
            )
        if dp == "DigitsDataProcessor" and (m.input_size != 64 or m.num_classes < 10):
            problems.append(
                Problem(
                    "model.input_size",
                    "DigitsDataProcessor gives 64 features (8x8 images) and "
                    "10 classes: set input_size: 64 and num_classes: 10",
                    m.input_size,
                )
            )
        if inp.max_sequence_length is not None:
            problems.append(
                Problem(
                    f"{sec}.max_sequence_length",
                    "applies to language models (gpt2, llama) only",
                    inp.max_sequence_length,
                )
            )
    return problems


def _check_optimizer(o: OptimizerParams) -> list[Problem]:
    problems = []
    if o.optimizer_type != "sgd":
        for key in ("momentum", "nesterov"):
            if getattr(o, key):
                problems.append(
                    Problem(
                        f"optimizer.{key}",
                        f"applies to optimizer_type sgd only, not {o.optimizer_type}",
                        getattr(o, key),
                    )
                )
    elif o.nesterov and o.momentum == 0:
        problems.append(Problem("optimizer.nesterov", "needs optimizer.momentum > 0", True))
    for i, piece in enumerate(o.learning_rate):
        problems += piece.problems(f"optimizer.learning_rate[{i}]", last=i == len(o.learning_rate) - 1)
    return problems

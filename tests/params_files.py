"""Params files the tests share, as the dicts a params file loads to.

``TINY`` is the appliance's test job (a GPT-2 whose dozen steps take seconds, with every kind of unit, an
eval and a learning-rate schedule); ``TINY_GPT2`` and ``TINY_LLAMA`` are models alone, for the numerics;
``SPARSE_GPT2`` is large enough for the sparse kernels; ``TRAINER_YAML`` and ``LEGACY`` are one run in
ModelZoo's two layouts. Tests change a copy (``copy.deepcopy``), never these."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# A GPT-2 small enough that a run of a dozen steps takes seconds, with every kind of unit in it.
TINY: dict[str, Any] = {
    "train_input": {
        "data_processor": "SyntheticDataProcessor",
        "batch_size": 8,
        "max_sequence_length": 16,
        "shuffle_seed": 3,
    },
    "eval_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 64,
        "max_position_embeddings": 16,
    },
    "optimizer": {
        "optimizer_type": "adamw",
        "betas": [0.9, 0.95],
        "weight_decay": 0.01,
        "max_gradient_norm": 1.0,
        "learning_rate": [
            {
                "scheduler": "Linear",
                "initial_learning_rate": 0.0,
                "end_learning_rate": 3.0e-3,
                "total_iters": 3,
            },
            {
                "scheduler": "CosineDecay",
                "initial_learning_rate": 3.0e-3,
                "end_learning_rate": 3.0e-4,
                "total_iters": 9,
            },
        ],
    },
    "runconfig": {
        "max_steps": 8,
        "log_steps": 1,
        "eval_steps": 2,
        "seed": 7,
        "num_wgt_servers": 2,
        "rpc_timeout_s": 60.0,
    },
}

# A GPT-2 for tests of the model alone (initialisation, checkpoint formats): no eval, no schedule
TINY_GPT2: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 4, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 64,
        "max_position_embeddings": 16,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"max_steps": 2, "seed": 7},
}
# TINY_GPT2's sizes as a LLaMA with grouped queries (2 kv groups of 4 heads)
TINY_LLAMA: dict[str, Any] = {
    **TINY_GPT2,
    "model": {
        "name": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 48,
        "max_position_embeddings": 16,
        "attention_module": "multiquery_attention",
        "extra_attention_params": {"num_kv_groups": 2},
    },
}

# Large enough that the rule sends some products through the sparse kernels (the sparsity appliance tests
# check that it does), small enough for seconds per run.
SPARSE_GPT2: dict[str, Any] = {
    "train_input": {
        "data_processor": "SyntheticDataProcessor",
        "batch_size": 8,
        "max_sequence_length": 32,
        "shuffle_seed": 3,
    },
    "eval_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8, "max_sequence_length": 32},
    "model": {
        "name": "gpt2",
        "vocab_size": 128,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 512,
        "max_position_embeddings": 32,
    },
    "optimizer": {
        "optimizer_type": "adamw",
        "learning_rate": 3e-3,
        "max_gradient_norm": 1.0,
        "weight_decay": 0.01,
    },
    "runconfig": {"max_steps": 12, "log_steps": 1, "eval_steps": 2, "seed": 7, "num_wgt_servers": 2},
    "sparsity": {"sparsity": 0.9, "init_method": "random"},
}

# A trainer: file as ModelZoo writes them (Cerebras-GPT's shape, sizes made small), anchors included.
TRAINER_YAML = """
trainer:
  init:
    backend:
      backend_type: CSX
      cluster_config: {num_csx: 2, max_wgt_servers: 2}
    model_dir: ./model_dir/trainer
    seed: 3
    model:
      name: gpt3
      hidden_size: 64
      position_embedding_type: learned
      share_embedding_weights: true
      max_position_embeddings: 64
      vocab_size: 256
      num_hidden_layers: 2
      dropout_rate: 0.0
      layer_norm_epsilon: 1.0e-05
      num_heads: 4
      attention_type: scaled_dot_product
      use_projection_bias_in_attention: true
      use_ffn_bias_in_attention: true
      filter_size: 256
      nonlinearity: gelu
      use_ffn_bias: true
      use_bias_in_output: false
    optimizer:
      AdamW:
        betas: [0.9, 0.95]
        eps: 1.0e-08
        weight_decay: 0.1
        correct_bias: true
    schedulers:
    - SequentialLR:
        schedulers:
        - LinearLR: {initial_learning_rate: 0.0, end_learning_rate: 0.0006, total_iters: 10}
        - CosineDecayLR: {initial_learning_rate: 0.0006, end_learning_rate: 6.0e-05, total_iters: 90}
    precision:
      enabled: true
      fp16_type: cbfloat16
      precision_opt_level: 1
      loss_scaling_factor: dynamic
      max_gradient_norm: 1.0
      log_loss_scale: true
    loop: {max_steps: 100, eval_frequency: 50, eval_steps: 2}
    checkpoint: {steps: 50, save_initial_checkpoint: false}
    logging: {log_steps: 5}
    callbacks:
    - ComputeNorm: {}
    - ScopedTrainFlags: {csx.performance.micro_batch_size: 4}
    - KeepNCheckpoints: {n: 2}
  fit:
    train_dataloader:
      data_processor: SyntheticDataProcessor
      max_sequence_length: 32
      shuffle: true
      shuffle_seed: 0
      batch_size: 16
      num_workers: 1
      prefetch_factor: 10
      persistent_workers: true
    val_dataloader: &val_dataloader
      data_processor: SyntheticDataProcessor
      max_sequence_length: 32
      batch_size: 16
      shuffle: false
  validate:
    val_dataloader: *val_dataloader
  validate_all:
    val_dataloaders: *val_dataloader
"""

# The same run in the legacy layout.
LEGACY: dict[str, Any] = {
    "train_input": {
        "data_processor": "SyntheticDataProcessor",
        "max_sequence_length": 32,
        "shuffle": True,
        "shuffle_seed": 0,
        "batch_size": 16,
        "num_workers": 1,
        "micro_batch_size": 4,
    },
    "eval_input": {
        "data_processor": "SyntheticDataProcessor",
        "max_sequence_length": 32,
        "batch_size": 16,
        "shuffle": False,
    },
    "model": {
        "name": "gpt3",
        "hidden_size": 64,
        "max_position_embeddings": 64,
        "vocab_size": 256,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "filter_size": 256,
        "nonlinearity": "gelu",
        "fp16_type": "bfloat16",
    },
    "optimizer": {
        "optimizer_type": "adamw",
        "betas": [0.9, 0.95],
        "eps": 1.0e-8,
        "weight_decay": 0.1,
        "max_gradient_norm": 1.0,
        "learning_rate": [
            {
                "scheduler": "Linear",
                "initial_learning_rate": 0.0,
                "end_learning_rate": 6e-4,
                "total_iters": 10,
            },
            {
                "scheduler": "CosineDecay",
                "initial_learning_rate": 6e-4,
                "end_learning_rate": 6e-5,
                "total_iters": 90,
            },
        ],
    },
    "runconfig": {
        "num_csx": 2,
        "num_wgt_servers": 2,
        "max_steps": 100,
        "eval_frequency": 50,
        "eval_steps": 2,
        "checkpoint_steps": 50,
        "log_steps": 5,
        "seed": 3,
        "model_dir": "./model_dir/trainer",
        "keep_checkpoint_max": 2,
    },
}


def padded_hdf5_params(tmp: Path) -> dict[str, Any]:
    """TINY (vocab 64, T 16, batch 8) reading two HDF5 files of 12 samples each with padding, written into
    ``tmp``: loss masks that honour padding, for the worker's step, the reference and a run."""
    h5py = pytest.importorskip("h5py", reason="GptHDF5MapDataProcessor reads HDF5 with h5py")
    rng = np.random.default_rng(0)
    seq = TINY["train_input"]["max_sequence_length"]
    for part in range(2):
        data = np.zeros((12, 3, seq), np.int32)  # [n, 3, T]
        for i in range(12):
            length = seq - (3 * i) % seq  # 16, 13, 10, ...: padding at the end of most samples
            ids = rng.integers(1, 64, length + 1)
            data[i, 0, :length], data[i, 1, :length], data[i, 2, :length] = ids[:-1], 1, ids[1:]
        with h5py.File(tmp / f"part{part}.h5", "w") as f:
            f.create_dataset("data", data=data)
            f.attrs["n_examples"] = 12
    raw = copy.deepcopy(TINY)
    for sec in ("train_input", "eval_input"):
        raw[sec].update(data_processor="GptHDF5MapDataProcessor", data_dir=str(tmp))
    return raw

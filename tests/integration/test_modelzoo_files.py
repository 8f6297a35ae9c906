"""Params files as ModelZoo writes them (written for these tests in the shape of ModelZoo's published
GPT-2, Cerebras-GPT, static-sparsity GPT-3 and LLaMA 3 configs; sizes, data paths, batch sizes and step
counts made small) pass `weightstream validate` and train through `weightstream run --num_csx 2` with a
falling loss; a converted legacy file trains bitwise the same as the original."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.integration.appliance import metrics, run, weightstream_cmd
from tests.integration.hdf5_corpus import byte_documents, write_corpus

h5py = pytest.importorskip("h5py", reason="GptHDF5MapDataProcessor reads HDF5 with h5py")

STEPS = 12

# ModelZoo's params_gpt2_small.yaml (release 2.2), legacy layout, without the model.name that 2.4 requires
GPT2_LEGACY = """
train_input:
    data_processor: "GptHDF5MapDataProcessor"
    data_dir: "{data}"
    batch_size: 8
    shuffle: False
    shuffle_seed: 256
    num_workers: 8
    prefetch_factor: 10
    persistent_workers: True
    max_sequence_length: 32
eval_input:
    data_processor: "GptHDF5MapDataProcessor"
    data_dir: "{data}"
    batch_size: 8
    shuffle: False
    num_workers: 8
    max_sequence_length: 32
model:
    hidden_size: 64
    vocab_size: 256
    position_embedding_type: "learned"
    share_embedding_weights: True
    max_position_embeddings: 64
    num_hidden_layers: 2
    dropout_rate: 0.1
    layer_norm_epsilon: 1.0e-5
    loss_scaling: "num_tokens"
    loss_weight: 1.0
    num_heads: 4
    attention_type: "scaled_dot_product"
    attention_dropout_rate: 0.1
    use_projection_bias_in_attention: True
    use_ffn_bias_in_attention: True
    filter_size: 256
    nonlinearity: "gelu"
    use_ffn_bias: True
    use_bias_in_output: False
    mixed_precision: True
    fp16_type: "cbfloat16"
optimizer:
    optimizer_type: "adamw"
    betas: [0.9, 0.95]
    eps: 1.0e-8
    max_gradient_norm: 1.0
    learning_rate:
      - scheduler: "Linear"
        initial_learning_rate: 0.0
        end_learning_rate: 0.003
        total_iters: 3
      - scheduler: "Linear"
        initial_learning_rate: 0.003
        end_learning_rate: 0.0
        total_iters: 30
    weight_decay: 0.01
    initial_loss_scale: 2147483648.0
    max_loss_scale: 2147483648.0
    loss_scaling_factor: "dynamic"
runconfig:
    max_steps: {steps}
    log_steps: 1
    checkpoint_steps: {steps}
    save_initial_checkpoint: True
    seed: 1
    model_dir: "./model_dir"
    eval_steps: 1
    eval_frequency: {steps}
"""

# Cerebras-GPT's static-sparsity GPT-3 config (params_gpt3_125m_static75.yaml), trainer: layout
GPT3_SPARSE = """
trainer:
  init:
    backend:
      backend_type: CSX
    model:
      name: "gpt3"
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
      attention_dropout_rate: 0.0
      use_projection_bias_in_attention: true
      use_ffn_bias_in_attention: true
      filter_size: 256
      nonlinearity: gelu
      use_ffn_bias: true
      embedding_initializer: {mean: 0.0, name: truncated_normal, std: 0.02, a: -0.04, b: 0.04}
      initializer: {mean: 0.0, name: truncated_normal, std: 0.02, a: -0.04, b: 0.04}
      output_layer_initializer:
        mean: 0.0
        name: truncated_normal
        std: 0.0070710678118654745
        a: -0.014142135623730949
        b: 0.014142135623730949
      loss_scaling: num_tokens
      loss_weight: 1.0
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
        - LinearLR: {initial_learning_rate: 0.0, end_learning_rate: 0.003, total_iters: 3}
        - CosineDecayLR: {initial_learning_rate: 0.003, end_learning_rate: 0.0003, total_iters: 30}
    precision:
      enabled: true
      fp16_type: cbfloat16
      precision_opt_level: 1
      loss_scaling_factor: dynamic
      max_gradient_norm: 1.0
      log_loss_scale: true
    sparsity:
      sparsity: 0.75
      init_method: random
      param_filter:
      - '*proj_[qkv]_dense_layer.weight'
      - '*proj_output_dense_layer.weight'
      - '*linear_layer.weight'
    loop: {max_steps: {steps}, eval_frequency: {steps}, eval_steps: 1}
    checkpoint: {steps: {steps}, save_initial_checkpoint: false}
    logging: {log_steps: 1}
    callbacks:
    - ComputeNorm: {}
  fit:
    train_dataloader:
      data_processor: GptHDF5MapDataProcessor
      data_dir: ["{data}"]
      shuffle: true
      shuffle_seed: 0
      batch_size: 8
      num_workers: 1
      prefetch_factor: 10
      persistent_workers: true
    val_dataloader: &val_dataloader
      data_processor: GptHDF5MapDataProcessor
      data_dir: "{data}"
      batch_size: 8
      shuffle: false
      num_workers: 1
  validate:
    val_dataloader: *val_dataloader
  validate_all:
    val_dataloaders: *val_dataloader
"""

# LLaMA 3.1's config (params_llama3p1_8b_msl_8k.yaml), trainer: layout, RoPE scaling llama3 included
LLAMA3 = """
trainer:
  fit:
    train_dataloader:
      batch_size: 8
      data_dir: "{data}"
      data_processor: GptHDF5MapDataProcessor
      num_workers: 8
      persistent_workers: true
      prefetch_factor: 10
      shuffle: true
      shuffle_seed: 1337
    val_dataloader: &id001
      batch_size: 8
      data_dir: "{data}"
      data_processor: GptHDF5MapDataProcessor
      num_workers: 8
      shuffle: false
  init:
    backend:
      backend_type: CSX
    callbacks:
    - GlobalFlags:
        csx.debug.compile_crd_memory_gi: 67
        csx.debug.execute_crd_memory_gi: 50
    - ScopedTrainFlags:
        csx.performance.micro_batch_size: 2
    - ScopedValidateFlags:
        csx.performance.micro_batch_size: 2
    - ComputeNorm: {}
    - LoadCheckpointStates:
        load_checkpoint_states: model
    checkpoint:
      disable_strict_checkpoint_loading: true
      save_initial_checkpoint: false
      steps: {steps}
    logging:
      log_steps: 1
    loop:
      eval_steps: 1
      max_steps: {steps}
      eval_frequency: {steps}
    model:
      name: llama
      attention_dropout_rate: 0.0
      attention_module: multiquery_attention
      attention_type: scaled_dot_product
      dropout_rate: 0.0
      embedding_dropout_rate: 0.0
      embedding_layer_norm: false
      extra_attention_params:
        num_kv_groups: 2
      filter_size: 176
      hidden_size: 64
      initializer_range: 0.02
      layer_norm_epsilon: 1.0e-05
      loss_scaling: num_tokens
      loss_weight: 1.0
      max_position_embeddings: 64
      nonlinearity: swiglu
      norm_type: rmsnorm
      num_heads: 4
      num_hidden_layers: 2
      pos_scaling_extra_args:
        high_freq_factor: 4.0
        low_freq_factor: 1.0
        original_max_position_embeddings: 16
      pos_scaling_factor: 8.0
      pos_scaling_type: llama3
      position_embedding_type: rotary
      rope_theta: 500000.0
      rotary_dim: 16
      share_embedding_weights: false
      use_bias_in_output: false
      use_ffn_bias: false
      use_ffn_bias_in_attention: false
      use_projection_bias_in_attention: false
      vocab_size: 256
    optimizer:
      Adam:
        betas: [0.9, 0.95]
        correct_bias: true
        weight_decay: 0.1
    precision:
      enabled: true
      fp16_type: cbfloat16
      log_loss_scale: true
      loss_scaling_factor: dynamic
      max_gradient_norm: 1.0
    schedulers:
    - LinearLR:
        initial_learning_rate: 0.003
        end_learning_rate: 0.0003
        total_iters: {steps}
    seed: 1
  validate:
    val_dataloader: *id001
  validate_all:
    val_dataloaders: *id001
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-level HDF5 data (vocab 256, 32 tokens a sample) in ModelZoo's layout."""
    from pydoc_data.topics import topics

    where = tmp_path_factory.mktemp("modelzoo") / "h5"
    write_corpus(where, byte_documents("\n".join(list(topics.values())[:40])), files=2)
    return where


def _write(tmp: Path, text: str, data: Path, name: str = "params.yaml") -> Path:
    path = tmp / name
    path.write_text(text.replace("{data}", str(data)).replace("{steps}", str(STEPS)))
    return path


def _validate(path: Path) -> Any:
    import subprocess

    return subprocess.run(
        [*weightstream_cmd(), "validate", str(path)], capture_output=True, text=True, check=False
    )


def _trains(path: Path, model_dir: Path) -> dict[int, float]:
    r = run(path, model_dir, "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    assert "keys used as written" in r.stdout  # the key report opens the run
    losses, evals = metrics(model_dir)
    assert sorted(losses) == list(range(1, STEPS + 1)) and STEPS in evals
    assert np.mean([losses[s] for s in range(STEPS - 2, STEPS + 1)]) < 0.9 * losses[1], losses
    return losses


def test_legacy_gpt2_asks_for_its_name_then_trains(tmp_path: Path, data: Path) -> None:
    path = _write(tmp_path, GPT2_LEGACY, data)
    r = _validate(path)
    assert r.returncode == 2 and "add the line `name: gpt2` under `model:`" in r.stderr, r.stderr
    path.write_text(path.read_text().replace("model:\n", "model:\n    name: gpt2\n", 1))
    r = _validate(path)
    assert r.returncode == 0, r.stderr
    assert "not applicable" in r.stdout and "prefetch_factor" in r.stdout
    _trains(path, tmp_path / "m")
    assert (tmp_path / "m" / "checkpoint_0").is_dir()  # save_initial_checkpoint


def test_sparse_gpt3_trains_and_stays_sparse(tmp_path: Path, data: Path) -> None:
    path = _write(tmp_path, GPT3_SPARSE, data)
    r = _validate(path)
    assert r.returncode == 0, r.stderr
    assert "'*proj_[qkv]_dense_layer.weight': 2 tensors" in r.stdout  # what each filter selected
    _trains(path, tmp_path / "m")
    weights = load_file(str(tmp_path / "m" / f"checkpoint_{STEPS}" / "model.safetensors"))
    for name in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
        w = weights[f"transformer.h.1.{name}"]
        assert abs(np.count_nonzero(w) / w.size - 0.25) < 0.01, name  # 75% zeros, still after training
    assert np.count_nonzero(weights["transformer.wte.weight"]) == weights["transformer.wte.weight"].size


def test_llama3_trains(tmp_path: Path, data: Path) -> None:
    path = _write(tmp_path, LLAMA3, data)
    assert _validate(path).returncode == 0
    _trains(path, tmp_path / "m")


@pytest.mark.slow  # two trainings, ~10 s
def test_converted_legacy_file_trains_bitwise_the_same(tmp_path: Path, data: Path) -> None:
    import subprocess

    legacy = _write(tmp_path, GPT2_LEGACY.replace("model:\n", "model:\n    name: gpt2\n", 1), data)
    converted = tmp_path / "trainer.yaml"
    r = subprocess.run(
        [*weightstream_cmd(), "config", "convert", str(legacy), "-o", str(converted)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "trainer" in yaml.safe_load(converted.read_text())
    for path, model_dir in ((legacy, tmp_path / "a"), (converted, tmp_path / "b")):
        r = run(path, model_dir, "--num_csx", "2", "--max_steps", "3")
        assert r.returncode == 0, r.stderr
    a = load_file(str(tmp_path / "a" / "checkpoint_3" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoint_3" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert metrics(tmp_path / "a")[0] == metrics(tmp_path / "b")[0]

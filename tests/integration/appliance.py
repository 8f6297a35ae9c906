"""Helpers for running the appliance the way a user does: `weightstream run` in a subprocess. ``TINY``
(tests/params_files.py) is the job they run unless a test says otherwise."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import load_file

from tests.params_files import TINY

# A run's losses against the reference trainer's, relative: float32 rounding (the tree sums gradients in
# another order than the reference, and the global norm is summed per shard); after 8 AdamW steps of TINY
# they agree to about 1e-6.
LOSS_RTOL = 2e-5


def write_params(tmp: Path, **runconfig: Any) -> Path:
    p = json.loads(json.dumps(TINY))
    p["runconfig"].update(runconfig)
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def write_llama_params(tmp: Path, **runconfig: Any) -> Path:
    """A LLaMA params file in ``tmp`` (``runconfig`` over its own): rotary, RMSNorm, SwiGLU, 2 kv groups of 4
    heads, no biases, untied embeddings, byte-level text: the Python documentation's topics that ship with
    Python (pydoc_data; English that does not change from one commit of ours to the next), 40 to train on,
    the next 10 held out."""
    names = sorted(topics)
    for split, part in (("train", names[:40]), ("eval", names[40:50])):
        text = "\n\n".join(topics[n] for n in part).encode("utf-8")
        (tmp / split).mkdir(exist_ok=True)
        (tmp / split / "part.txt").write_bytes(text)
    params = {
        "train_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(tmp / "train"),
            "batch_size": 8,
            "max_sequence_length": 32,
            "shuffle_seed": 1,
        },
        "eval_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(tmp / "eval"),
            "batch_size": 8,
            "max_sequence_length": 32,
        },
        "model": {
            "name": "llama",
            "vocab_size": 256,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_heads": 4,
            "filter_size": 172,
            "max_position_embeddings": 64,
            "position_embedding_type": "rotary",
            "rope_theta": 10000.0,
            "norm_type": "rmsnorm",
            "nonlinearity": "swiglu",
            "attention_module": "multiquery_attention",
            "extra_attention_params": {"num_kv_groups": 2},
            "use_ffn_bias": False,
            "use_projection_bias_in_attention": False,
            "use_ffn_bias_in_attention": False,
            "share_embedding_weights": False,
        },
        "optimizer": {
            "optimizer_type": "adamw",
            "betas": [0.9, 0.95],
            "weight_decay": 0.1,
            "max_gradient_norm": 1.0,
            "learning_rate": [
                {
                    "scheduler": "Linear",
                    "initial_learning_rate": 0.0,
                    "end_learning_rate": 1e-2,
                    "total_iters": 5,
                },
                {
                    "scheduler": "CosineDecay",
                    "initial_learning_rate": 1e-2,
                    "end_learning_rate": 1e-3,
                    "total_iters": 115,
                },
            ],
        },
        "runconfig": {
            "max_steps": 120,
            "log_steps": 1,
            "eval_steps": 4,
            "seed": 3,
            "num_wgt_servers": 2,
            **runconfig,
        },
    }
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def weightstream_cmd() -> list[str]:
    exe = shutil.which("weightstream")
    return [exe] if exe else [sys.executable, "-m", "weightstream.cli"]


def sigint_at_default() -> None:
    """``preexec_fn`` of a run a test will stop with SIGINT, as Ctrl-C would: a suite started in the
    background of a shell without job control inherits SIGINT ignored, and Python then gives the run no
    KeyboardInterrupt to stop on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(params: Path, model_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [*weightstream_cmd(), "run", str(params), "--model_dir", str(model_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def metrics(model_dir: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(train loss by step, eval loss by step) from metrics.jsonl."""
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return (
        {r["step"]: r["loss"] for r in rows if "loss" in r},
        {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r},
    )


def run_uninterrupted(tmp: Path, params: dict[str, Any], name: str = "straight") -> Path:
    """``params`` trained by `weightstream run` with one CS-2 in one go: the run an interrupted job must
    equal. Returns its model_dir."""
    params_path = tmp / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    model_dir = tmp / name
    r = run(params_path, model_dir, "--num_csx", "1")
    assert r.returncode == 0, r.stderr
    return model_dir


def transformers_loss(checkpoint: Path, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """The mean cross-entropy over ``batches`` (inputs, targets) of ``checkpoint`` loaded by transformers'
    ``AutoModelForCausalLM``: what weightstream's loss of the same weights must equal. Needs the test
    extra (torch, transformers)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    losses = []
    for x, y in batches:
        with torch.no_grad():
            logits = model(torch.as_tensor(x)).logits
        flat = logits.reshape(-1, logits.shape[-1])
        losses.append(torch.nn.functional.cross_entropy(flat, torch.as_tensor(y).reshape(-1)).item())
    return float(np.mean(losses))


def resume_copy(params: Path, checkpoint: Path, model_dir: Path, num_csx: str) -> Path:
    """A new ``model_dir`` holding only a copy of ``checkpoint``, trained on by `weightstream run` with
    ``num_csx`` workers: the resume must pick the checkpoint up. Returns ``model_dir``."""
    model_dir.mkdir()
    shutil.copytree(checkpoint, model_dir / checkpoint.name)
    r = run(params, model_dir, "--num_csx", num_csx)
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stdout
    return model_dir


def checkpoint_weights(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    """Every weight of ``checkpoint_<step>``, merged over the MemoryX shards' model files."""
    tensors: dict[str, np.ndarray] = {}
    for f in sorted((model_dir / f"checkpoint_{step}").glob("model*.safetensors")):
        tensors.update(load_file(f))
    return tensors

"""weightstream against PyTorch training the same GPT-2 on the same text, on the same machine.

Trains the same model (GPT-2 d768 / L12 / H12, vocab 8192, sequence 256, global batch 8, AdamW lr 1e-4,
weight decay 0.01, gradient clipping at 1.0, float32) on the same token windows four ways, one after another:

- PyTorch eager, one process on all cores: a GPT-2 written with ``torch.nn`` (pre-LN, learned positions,
  tied head, tanh GELU, biases, fused ``scaled_dot_product_attention(is_causal=True)``),
  ``torch.optim.AdamW``, ``clip_grad_norm_``; tokens/s = B*T / the median time of whole steps;
- ``weightstream run --num_csx 1``: tokens/s = B*T / the median wall time from one step's commit to the
  next, everything counted. Its ``metrics.jsonl`` logs ``tokens_per_second`` as a running average since
  training began (tokens so far / time so far, the slow first step included), so each step's interval is
  recovered from consecutive rows (elapsed = step * B*T / tokens_per_second); the median of the logged
  running averages is reported too, as ``weightstream_logged_tokens_per_second``;
- PyTorch DDP (gloo), 2 processes each with half the batch and half the cores;
- ``weightstream run --num_csx 2``.

Both sides start from the same weights (weightstream's own initialiser, by tensor name) and read the same
batches (weightstream's ``TextFileDataProcessor`` over text files of this machine, built in-process for
PyTorch), so their first-step losses agree (~ln(vocab)) and their loss curves track each other.
Medians are over the steps after the first 2. Prints one JSON line (progress goes to stderr):

    python bench/peer.py [--hidden 768 --layers 12 --heads 12 --vocab 8192 --seq 256 --batch 8 --steps 8]
                         [--skip-ddp]
"""

from __future__ import annotations

import weightstream  # noqa: F401  (before numpy: it picks numpy's OpenBLAS kernels, blas_kernel.py)

# isort: split
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
import torch.nn.functional as F
import yaml
from machine import record  # bench/machine.py: the machine, date, command and commit
from text_corpus import text_corpus  # bench/text_corpus.py
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from weightstream.data import make_data_processor
from weightstream.numerics import init_params
from weightstream.numerics._gemm import engine
from weightstream.numerics.optim import is_bias_or_norm
from weightstream.params import load_params, model_def
from weightstream.params.schema import GPT2ModelParams
from weightstream.params.size import num_params

WARMUP = 2  # steps left out of the medians
DDP_RANKS = 2


def log(msg: str) -> None:
    print(f"[peer] {msg}", file=sys.stderr, flush=True)


def params_dict(a: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    return {
        "train_input": {
            "data_processor": "TextFileDataProcessor",
            "data_dir": str(data_dir),
            "batch_size": a.batch,
            "max_sequence_length": a.seq,
            "shuffle": True,
            "shuffle_seed": 1,
        },
        "model": {
            "name": "gpt2",
            "vocab_size": a.vocab,
            "hidden_size": a.hidden,
            "num_hidden_layers": a.layers,
            "num_heads": a.heads,
            "max_position_embeddings": a.seq,
            # GPT-2's own (Hugging Face's gelu_new), the tanh form the PyTorch peer computes; ModelZoo's
            # default would be the exact erf GELU, a different model (and a slower one here)
            "nonlinearity": "gelu_new",
        },
        "optimizer": {
            "optimizer_type": "adamw",
            "learning_rate": 1e-4,
            "weight_decay": 0.01,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "max_gradient_norm": 1.0,
        },
        "runconfig": {"max_steps": a.steps, "log_steps": 1, "num_wgt_servers": 1, "seed": 1},
    }


def after_warmup(xs: Sequence[float]) -> list[float]:
    """The values a median is taken over: those after the first WARMUP (the last one if no more)."""
    return list(xs[WARMUP:]) or list(xs[-1:])


def median(xs: Sequence[float]) -> float:
    return statistics.median(after_warmup(xs))


# -- the PyTorch peer ------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, c: int, f: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c, eps=eps), nn.LayerNorm(c, eps=eps)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(c, 3 * c), "c_proj": nn.Linear(c, c)})
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(c, f), "c_proj": nn.Linear(f, c)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.attn["c_attn"](self.ln_1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in qkv)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn["c_proj"](a)
        return x + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2 (pre-LN, learned positions, head tied to the token embedding)."""

    def __init__(self, vocab: int, positions: int, c: int, f: int, layers: int, heads: int, eps: float):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(positions, c)
        self.h = nn.ModuleList(Block(c, f, heads, eps) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c, eps=eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head

    def load_weightstream(self, w: dict[str, np.ndarray]) -> None:
        """Copy weightstream's tensors in: the same Hugging Face names (less ``transformer.``), but
        nn.Linear keeps its weight [out, in] where Conv1D keeps it [in, out]."""
        sd = {}
        for name in self.state_dict():
            v = w["transformer." + name]
            sd[name] = torch.from_numpy(
                np.ascontiguousarray(v.T if name.startswith("h.") and v.ndim == 2 else v)
            )
        self.load_state_dict(sd)


def torch_model(raw: dict[str, Any]) -> GPT2:
    p = load_params(raw)
    m = p.model
    assert isinstance(m, GPT2ModelParams)
    model = GPT2(
        m.vocab_size,
        m.max_position_embeddings,
        m.hidden_size,
        m.inner_size,
        m.num_hidden_layers,
        m.num_heads,
        m.layer_norm_epsilon,
    )
    model.load_weightstream(init_params(model_def(p), p.runconfig.seed))
    return model


def torch_batches(raw: dict[str, Any], steps: int, rank: int, ranks: int) -> list[tuple[torch.Tensor, ...]]:
    """The token windows weightstream trains on at each step: rank ``rank``'s slice of the global batch."""
    p = load_params(raw)
    data = make_data_processor(p.train_input, p.model, "train")
    return [tuple(torch.from_numpy(z) for z in data.shard(s, rank, ranks)) for s in range(steps)]


def train_torch(
    model: nn.Module, raw: dict[str, Any], batches: list[tuple[torch.Tensor, ...]], what: str
) -> dict[str, list[float]]:
    """Train ``model`` one step per batch; the loss and the time of each step and of its phases."""
    o = raw["optimizer"]
    # the appliance's (ModelZoo's) parameter groups: no weight decay on biases and LayerNorm weights
    no_decay = {n for n, _ in model.named_parameters() if is_bias_or_norm(n.removeprefix("module."))}
    groups: list[dict[str, Any]] = [
        {"params": [p for n, p in model.named_parameters() if n not in no_decay]},
        {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(
        groups,
        lr=o["learning_rate"],
        betas=o["betas"],
        eps=o["eps"],
        weight_decay=o["weight_decay"],
    )
    out: dict[str, list[float]] = {k: [] for k in ("loss", "step_s", "forward_s", "backward_s", "optim_s")}
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()  # under DDP: with the gradients' all-reduce
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["max_gradient_norm"])
        opt.step()
        value = loss.item()
        t3 = time.perf_counter()
        for k, v in zip(out, (value, t3 - t0, t1 - t0, t2 - t1, t3 - t2), strict=True):
            out[k].append(v)
        log(f"{what} step {i + 1}/{len(batches)}: loss {value:.4f}, {t3 - t0:.2f} s")
    return out


def run_torch_eager(raw: dict[str, Any], steps: int) -> dict[str, list[float]]:
    torch.set_num_threads(os.cpu_count() or 1)
    return train_torch(torch_model(raw), raw, torch_batches(raw, steps, 0, 1), "torch eager")


def _ddp_rank(rank: int, raw: dict[str, Any], steps: int, out_dir: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // DDP_RANKS))
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=DDP_RANKS)
    try:
        model = DistributedDataParallel(torch_model(raw))
        got = train_torch(model, raw, torch_batches(raw, steps, rank, DDP_RANKS), f"torch DDP rank {rank}")
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(got))
    except BaseException:
        dist.destroy_process_group()
        raise
    # Both ranks are past their last collective and the results are written. gloo's teardown then once
    # aborted a rank ("terminate called without an active exception", SIGABRT) and failed the whole
    # bench: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_torch_ddp(raw: dict[str, Any], steps: int, work: Path) -> dict[str, list[float]]:
    """DDP over gloo with DDP_RANKS processes; per step the slowest rank's times, the ranks' mean loss."""
    out_dir = work / "ddp"
    out_dir.mkdir()
    if Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch_mp.spawn(_ddp_rank, args=(raw, steps, str(out_dir)), nprocs=DDP_RANKS, join=True)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(DDP_RANKS)]
    out = {k: [max(v) for v in zip(*(r[k] for r in ranks), strict=True)] for k in ranks[0]}
    out["loss"] = [statistics.fmean(v) for v in zip(*(r["loss"] for r in ranks), strict=True)]
    return out


# -- the appliance ---------------------------------------------------------------------------------
def run_appliance(raw: dict[str, Any], num_csx: int, work: Path) -> list[dict[str, Any]]:
    """`weightstream run` as a subprocess; its step rows from metrics.jsonl."""
    path = work / f"params{num_csx}.yaml"
    path.write_text(yaml.safe_dump(raw))
    model_dir = work / f"run{num_csx}"
    cmd = [sys.executable, "-m", "weightstream.cli", "run", str(path), "--num_csx", str(num_csx)]
    proc = subprocess.Popen(
        [*cmd, "--model_dir", str(model_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"[weightstream num_csx {num_csx}] {line}", end="", file=sys.stderr)
    if proc.wait() != 0:
        raise SystemExit(f"weightstream run --num_csx {num_csx} failed ({proc.returncode})")
    rows = [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "tokens_per_second" in r]


def appliance_summary(rows: list[dict[str, Any]], tokens: int) -> dict[str, float]:
    """Medians of a run's step rows. ``tokens_per_second`` in a row is tokens since training began over
    the time since then, so the wall time each step took (commit to commit, everything counted) is the
    difference of consecutive elapsed times, elapsed = step * tokens / tokens_per_second."""
    elapsed = [r["step"] * tokens / r["tokens_per_second"] for r in rows]
    intervals = [e - before for before, e in zip([0.0, *elapsed], elapsed, strict=False)]
    keys = ("step_time_s", "worker_compute_s", "worker_wait_s", "update_s")
    return {
        "tokens_per_second": tokens / median(intervals),
        "logged_tokens_per_second": median([r["tokens_per_second"] for r in rows]),
        "step_interval_s": median(intervals),
        **{k: median([r[k] for r in rows]) for k in keys},
    }


def torch_summary(got: dict[str, list[float]], tokens: int) -> dict[str, float]:
    out = {k: median(got[k]) for k in ("step_s", "forward_s", "backward_s", "optim_s")}
    return {"tokens_per_second": tokens / out["step_s"], **out}


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None else round(num / den, 4)


def result(
    a: argparse.Namespace,
    raw: dict[str, Any],
    runs: dict[str, dict[str, float]],
    losses: dict[str, list[float]],
    machine: dict[str, Any],
    text_bytes: int,
) -> dict[str, Any]:
    """The JSON line: figures rounded for reading, ratios from the unrounded figures."""
    names = ("torch_eager", "weightstream_num_csx_1", "torch_ddp_2", "weightstream_num_csx_2")
    tps = {k: runs[k]["tokens_per_second"] if k in runs else None for k in names}

    def r6(d: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 6) for k, v in d.items() if not k.endswith("tokens_per_second")}

    return {
        "bench": "peer",
        "config": {**vars(a), "parameters": num_params(load_params(raw).model), "text_bytes": text_bytes},
        "machine": machine,
        "tokens_per_second": {k: None if v is None else round(v, 1) for k, v in tps.items()},
        "ratio_weightstream_over_torch": ratio(tps["weightstream_num_csx_1"], tps["torch_eager"]),
        "ratio_num_csx_2_over_ddp": ratio(tps["weightstream_num_csx_2"], tps["torch_ddp_2"]),
        "weightstream_logged_tokens_per_second": {  # median of the running averages metrics.jsonl logs
            k: round(v["logged_tokens_per_second"], 1)
            for k, v in runs.items()
            if "logged_tokens_per_second" in v
        },
        "median_s": {k: r6(v) for k, v in runs.items()},
        "loss_first_step": {k: round(v[0], 5) for k, v in losses.items()},
        "loss_last_step": {k: round(v[-1], 5) for k, v in losses.items()},
        "loss_max_abs_diff_vs_torch_eager": {  # same weights, data and optimizer: the curves track
            k: round(max(abs(x - y) for x, y in zip(v, losses["torch_eager"], strict=True)), 6)
            for k, v in losses.items()
            if k != "torch_eager"
        },
        "ln_vocab": round(float(np.log(a.vocab)), 5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument(
        "--batch", type=int, default=8, help="global batch (halved per DDP rank / num_csx 2 worker)"
    )
    ap.add_argument(
        "--steps", type=int, default=8, help=f"steps per run; medians leave out the first {WARMUP}"
    )
    ap.add_argument("--skip-ddp", action="store_true", help="skip DDP and num_csx 2")
    a = ap.parse_args()
    if not a.skip_ddp and a.batch % DDP_RANKS:
        ap.error(f"--batch must be divisible by {DDP_RANKS} for DDP and num_csx 2 (or pass --skip-ddp)")
    machine = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gemm_engine": engine(),  # the workers' products (numerics/_gemm.py); torch was imported first
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],  # others' load on the shared cores
    }
    tokens = a.batch * a.seq
    runs: dict[str, dict[str, float]] = {}
    losses: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="peer_") as tmpdir:
        work = Path(tmpdir)
        text_bytes = text_corpus(work / "text", max(200_000, 2 * a.steps * a.batch * (a.seq + 1)))
        raw = params_dict(a, work / "text")
        log(f"{num_params(load_params(raw).model) / 1e6:.1f}M parameters, {text_bytes} bytes of text")

        t0 = time.monotonic()
        got = run_torch_eager(raw, a.steps)
        runs["torch_eager"], losses["torch_eager"] = torch_summary(got, tokens), got["loss"]
        log(f"torch eager done in {time.monotonic() - t0:.0f} s")

        jobs = [1] if a.skip_ddp else [1, 2]
        for n in jobs:
            if n == 2:
                t0 = time.monotonic()
                got = run_torch_ddp(raw, a.steps, work)
                runs["torch_ddp_2"], losses["torch_ddp_2"] = torch_summary(got, tokens), got["loss"]
                log(f"torch DDP done in {time.monotonic() - t0:.0f} s")
            t0 = time.monotonic()
            rows = run_appliance(raw, n, work)
            key = f"weightstream_num_csx_{n}"
            runs[key], losses[key] = appliance_summary(rows, tokens), [r["loss"] for r in rows]
            log(f"weightstream num_csx {n} done in {time.monotonic() - t0:.0f} s")
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(record("peer", result(a, raw, runs, losses, machine, text_bytes))))


if __name__ == "__main__":
    main()

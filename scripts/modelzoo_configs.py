"""ModelZoo's published params files through `weightstream validate` and `weightstream run --num_csx 2`.

    python scripts/modelzoo_configs.py MODELZOO_CONFIG_DIR DATA_DIR [--steps 30]

MODELZOO_CONFIG_DIR: any directory of ModelZoo params files (e.g. a checkout's
src/cerebras/modelzoo/models/nlp/{gpt2,gpt3,llama}/configs); DATA_DIR: HDF5 data in ModelZoo's GPT layout
(`weightstream data-preprocess`, vocabulary at most 300). Each file is changed only where the issue allows:
sizes (2 layers of 64, 4 heads, vocabulary 300), data paths, batch size, step counts (schedules warm up
over 3 steps and end at the last), and for a legacy file without `model.name` the line the error asks for.
Prints one line per file: trained (first loss -> mean of the last three), refused (the reasons), or failed.
Nothing here is a test: ModelZoo's files are not in this repository, so its figures are reproduced with it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml


def _pieces(pieces: list[dict[str, Any]], steps: int) -> None:
    """Step counts of a trainer: schedule list, in place."""
    for i, piece in enumerate(pieces):
        ((name, settings),) = piece.items()
        if name == "SequentialLR":
            settings.pop("milestones", None)
            _pieces(settings["schedulers"], steps)
        else:
            settings["total_iters"] = 3 if i == 0 and len(pieces) > 1 else steps


def _model(m: dict[str, Any]) -> None:
    m.update(hidden_size=64, num_hidden_layers=2, num_heads=4, max_position_embeddings=64, vocab_size=300)
    if "filter_size" in m:
        m["filter_size"] = 176 if m.get("nonlinearity") == "swiglu" else 256
    if "extra_attention_params" in m:
        m["extra_attention_params"]["num_kv_groups"] = 2
    if "rotary_dim" in m:
        m["rotary_dim"] = 16
    if "pos_scaling_extra_args" in m:
        m["pos_scaling_extra_args"]["original_max_position_embeddings"] = 16


def _input(i: dict[str, Any], data: str) -> None:
    i.update(data_dir=data, batch_size=8)
    if "micro_batch_size" in i:
        i["micro_batch_size"] = 2


def shrink(d: dict[str, Any], data: str, steps: int) -> dict[str, Any]:
    """``d`` with only sizes, data paths, batch size and step counts changed."""
    if "trainer" in d:
        init, fit = d["trainer"]["init"], d["trainer"]["fit"]
        _model(init["model"])
        init["loop"].update(max_steps=steps, eval_frequency=steps, eval_steps=1)
        init.setdefault("checkpoint", {})["steps"] = steps
        init.setdefault("logging", {})["log_steps"] = 1
        _pieces(init.get("schedulers", []), steps)
        for callback in init.get("callbacks", []):
            for flags in ("ScopedTrainFlags", "ScopedValidateFlags"):
                if flags in callback:
                    callback[flags]["csx.performance.micro_batch_size"] = 2
        for loader in ("train_dataloader", "val_dataloader"):
            if loader in fit:
                _input(fit[loader], data)
        return d
    _model(d["model"])
    for sec in ("train_input", "eval_input"):
        if sec in d:
            _input(d[sec], data)
            d[sec]["max_sequence_length"] = 32
    lr = d["optimizer"].get("learning_rate")
    for i, piece in enumerate(lr if isinstance(lr, list) else []):
        for key in ("total_iters", "steps", "decay_steps"):
            if key in piece:
                piece[key] = 3 if i == 0 and len(lr) > 1 else steps
    d["runconfig"].update(
        max_steps=steps, eval_frequency=steps, eval_steps=1, checkpoint_steps=steps, log_steps=1
    )
    return d


def _weightstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["weightstream", *args], capture_output=True, text=True, timeout=900, check=False)


def check(path: Path, data: str, steps: int, work: Path) -> str:
    d = yaml.safe_load(path.read_text())
    if not isinstance(d, dict) or ("trainer" not in d and "model" not in d):
        return "skipped (not a params file)"
    d = shrink(d, data, steps)
    params, note = work / "params.yaml", ""
    params.write_text(yaml.safe_dump(d, sort_keys=False))
    r = _weightstream("validate", str(params))
    asked = re.search(r"add the line `name: (\w+)`", r.stderr)
    if asked:  # a legacy file from before ModelZoo 2.4: add the line the error asks for
        d["model"]["name"] = asked.group(1)
        params.write_text(yaml.safe_dump(d, sort_keys=False))
        note = f" (added `name: {asked.group(1)}` as asked)"
        r = _weightstream("validate", str(params))
    if r.returncode:
        reasons = [line.strip()[2:] for line in r.stderr.splitlines() if line.strip().startswith("- ")]
        return "refused: " + " | ".join(reasons[:3])
    model_dir = work / f"m-{path.stem}"
    r = _weightstream("run", str(params), "--num_csx", "2", "--model_dir", str(model_dir))
    if r.returncode:
        return "FAILED: " + r.stderr.strip()[-300:]
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {row["step"]: row["loss"] for row in rows if "loss" in row}
    last = sum(losses[s] for s in range(steps - 2, steps + 1)) / 3
    word = "trained" if last < losses[1] else "LOSS DID NOT FALL"
    return f"{word}: loss {losses[1]:.4f} -> {last:.4f}{note}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", type=Path)
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(args.configs.rglob("*.yaml")):
            result = check(path, args.data, args.steps, Path(tmp))
            bad += result.startswith(("FAILED", "LOSS"))
            print(f"{path.relative_to(args.configs)}: {result}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

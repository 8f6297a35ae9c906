"""ModelZoo's published params files through weightstream's validation (every release) and training.

    python scripts/modelzoo_configs.py --modelzoo MODELZOO_GIT_DIR (--all-releases | --release TAG ...) [-v]
    python scripts/modelzoo_configs.py MODELZOO_CONFIG_DIR DATA_DIR [--steps 30]

Releases: MODELZOO_GIT_DIR is a clone of github.com/Cerebras/modelzoo (a bare one will do); nothing is
downloaded here. Each tag given with --release (--all-releases: every Release_2.2.x ... Release_2.10.x tag
the clone has) is read with `git show`: its GPT-2, GPT-3 (Cerebras-GPT, muP, sparsity) and LLaMA params files,
as published, go through what `weightstream validate` checks (the params and the model they define; the
data files they name are not opened). A legacy file without `model.name` (ModelZoo before 2.4) gets the
line the error asks for, and is counted apart. Prints per release: configs, validate ok, refused by key and
reason; with -v one line per refused file.

Training: MODELZOO_CONFIG_DIR is any directory of ModelZoo params files (e.g. a checkout's
src/cerebras/modelzoo/models/nlp/{gpt2,gpt3,llama}/configs); DATA_DIR: HDF5 data in ModelZoo's GPT layout
(`weightstream data-preprocess`, vocabulary at most 300). Each file is changed only where the issue allows:
sizes (2 layers of 64, 4 heads, vocabulary 300), data paths, batch size, step counts (schedules warm up
over 3 steps and end at the last), and for a file without `model.name` the line the error asks for.
Prints one line per file: trained (first loss -> mean of the last three), refused (the reasons), or failed.
Nothing here is a test: ModelZoo's files are not in this repository (apart from the few in
tests/data/modelzoo), so its figures are reproduced with it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
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


_ASKED = re.compile(r"add the line `name: (\w+)`")


def _model_section(d: dict[str, Any]) -> dict[str, Any]:
    return d["trainer"]["init"]["model"] if "trainer" in d else d["model"]


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
    asked = _ASKED.search(r.stderr)
    if asked:  # a file from before ModelZoo 2.4: add the line the error asks for
        _model_section(d)["name"] = asked.group(1)
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


_RELEASE = re.compile(r"^Release_2\.([2-9]|10)\.\d+$")
_CONFIG = re.compile(r"/models/nlp/(gpt2|gpt3|llama)/configs/.+\.yaml$")
_LAYOUT_PREFIX = re.compile(r"^trainer(\[0\])?\.(init|fit)\.")
_NOT_IMPLEMENTED = re.compile(r"^is a ModelZoo key weightstream does not implement: (.*); remove it$")


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, check=True
    ).stdout


def release_tags(git_dir: Path) -> list[str]:
    """Every ModelZoo 2.2 ... 2.10 release tag of the clone, oldest first."""
    tags = [t for t in _git(git_dir, "tag").split() if _RELEASE.match(t)]
    return sorted(tags, key=lambda t: tuple(int(n) for n in t.removeprefix("Release_").split(".")))


def release_configs(git_dir: Path, tag: str) -> list[str]:
    """The GPT-2, GPT-3 and LLaMA params files of one release (paths inside the repository)."""
    return [f for f in _git(git_dir, "ls-tree", "-r", "--name-only", tag).split() if _CONFIG.search(f)]


def _problems(d: dict[str, Any]) -> list[Any]:
    from weightstream.params import ParamsError, model_def, read_params

    try:
        model_def(read_params(d).params)
    except ParamsError as e:
        return e.problems
    return []


def validate(d: Any) -> tuple[str, list[tuple[str, str]]]:
    """("ok" | "ok, name added" | "refused" | "not a params file", [(key, reason)] of a refusal): what
    `weightstream validate` says of a published file, with a missing model.name added as asked."""
    if not isinstance(d, dict) or ("trainer" not in d and "model" not in d):
        return "not a params file", []
    problems, verdict = _problems(d), "ok"
    asked = next((m for m in (_ASKED.search(q.message) for q in problems) if m), None)
    if asked:  # a file from before ModelZoo 2.4
        _model_section(d)["name"] = asked.group(1)
        problems, verdict = _problems(d), "ok, name added"
    if not problems:
        return verdict, []
    reasons = []
    for q in problems:
        unsupported = _NOT_IMPLEMENTED.match(q.message)
        reasons.append((_LAYOUT_PREFIX.sub("", q.path), unsupported.group(1) if unsupported else q.message))
    return "refused", reasons


def sweep(git_dir: Path, tags: list[str], verbose: bool) -> int:
    """One block per release: configs, validate ok, refused by key and reason (files per reason)."""
    crashed = 0
    for tag in tags:
        files = release_configs(git_dir, tag)
        verdicts: Counter[str] = Counter()
        reasons: Counter[tuple[str, str]] = Counter()
        for f in files:
            try:
                verdict, why = validate(yaml.safe_load(_git(git_dir, "show", f"{tag}:{f}")))
            except Exception as e:  # a crash is a finding: report it, go on to the next file
                verdict, why, crashed = "CRASHED", [("", repr(e))], crashed + 1
            verdicts[verdict] += 1
            reasons.update(set(why))
            if verbose and why:
                print(f"  {verdict} {f.split('/models/nlp/')[-1]}: " + " | ".join(k for k, _ in why))
        ok = verdicts["ok"] + verdicts["ok, name added"]
        added = verdicts["ok, name added"]
        named = f" ({added} with `name:` added as asked)" if added else ""
        print(f"{tag}: {len(files)} configs, {ok} validate{named}, {verdicts['refused']} refused", flush=True)
        for (key, reason), n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"    {n:3d} {key}: {reason}")
    return 1 if crashed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", type=Path, nargs="?")
    ap.add_argument("data", nargs="?")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--modelzoo", type=Path, metavar="MODELZOO_GIT_DIR", help="a clone of ModelZoo")
    ap.add_argument("--release", action="append", metavar="TAG", help="validate this release (repeatable)")
    ap.add_argument("--all-releases", action="store_true", help="validate every release 2.2 ... 2.10")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per refused file")
    args = ap.parse_args()
    if args.release or args.all_releases:
        if args.modelzoo is None:
            ap.error("--release and --all-releases read from --modelzoo MODELZOO_GIT_DIR")
        return sweep(args.modelzoo, args.release or release_tags(args.modelzoo), args.verbose)
    if args.configs is None or args.data is None:
        ap.error("give MODELZOO_CONFIG_DIR and DATA_DIR, or --modelzoo with --release or --all-releases")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(args.configs.rglob("*.yaml")):
            result = check(path, args.data, args.steps, Path(tmp))
            bad += result.startswith(("FAILED", "LOSS"))
            print(f"{path.relative_to(args.configs)}: {result}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

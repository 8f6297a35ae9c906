"""A Hugging Face model directory (``save_pretrained``) as the starting point of a run: its config, its
files, its tensor names and shapes.

Shared by the coordinator (which checks a directory against the params before anything starts:
``training/hf_start.py``) and MemoryX (which reads each of its own tensors from it, one at a time, so the
model is never whole in any process: ``memoryx.storage.start_tensors``). Only safetensors are read:
``model.safetensors``, or
``model-0000i-of-0000K.safetensors`` with ``model.safetensors.index.json`` (the layout our own checkpoints
share, so a weightstream checkpoint directory is a valid starting point too: its weights, not its state).

Names: ours are Hugging Face's ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` names. A GPT-2 saved from the
bare ``GPT2Model`` (as the original ``gpt2`` files are) lacks the ``transformer.`` prefix; it is added.
Buffers some versions save (GPT-2's causal ``attn.bias`` / ``attn.masked_bias``, LLaMA's
``rotary_emb.inv_freq``) and a tied ``lm_head.weight`` are not weights of ours and are passed over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from safetensors import safe_open

__all__ = ["StartCheckpointError", "read_config", "stored_names", "tensor_shapes"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


class StartCheckpointError(ValueError):
    """A directory that cannot start this run: missing, not safetensors, or not this model."""


def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise StartCheckpointError(f"{path} is not a directory (a Hugging Face save_pretrained directory)")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StartCheckpointError(f"{path} has no config.json (not a save_pretrained directory)") from None
    except (OSError, ValueError) as e:
        raise StartCheckpointError(f"{path / 'config.json'}: cannot be read as JSON: {e}") from None
    if not isinstance(config, dict):
        raise StartCheckpointError(f"{path / 'config.json'}: not a JSON object")
    return config


def _files(path: Path) -> dict[str, str]:
    """Stored tensor name -> file, from the index or the single file."""
    if (path / _INDEX).is_file():
        try:
            weight_map = json.loads((path / _INDEX).read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StartCheckpointError(f"{path / _INDEX}: not a safetensors index ({e})") from None
        for f in set(weight_map.values()):
            if Path(f).name != f or not (path / f).is_file():  # a name in the index, never a path out
                raise StartCheckpointError(f"{path / _INDEX} names {f!r}, which is not a file beside it")
        return dict(weight_map)
    if (path / _SINGLE).is_file():
        with safe_open(str(path / _SINGLE), framework="numpy") as f:
            return dict.fromkeys(f.keys(), _SINGLE)
    if any(path.glob("pytorch_model*.bin")):
        raise StartCheckpointError(
            f"{path} holds pytorch_model*.bin (pickled torch tensors), which weightstream does not read; "
            'convert it once where torch and transformers are installed: python -c "from transformers import '
            f"AutoModelForCausalLM as M; M.from_pretrained('{path}').save_pretrained('{path}-safetensors')\""
        )
    raise StartCheckpointError(f"{path} has neither {_SINGLE} nor {_INDEX}")


def stored_names(path: Path, names: Sequence[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({our name: (stored name, file)} for the ``names`` found, [stored tensors that are not ours])."""
    files = _files(path)
    bare = not any(k.startswith("transformer.") for k in files) and any(k.startswith("h.") for k in files)
    found: dict[str, tuple[str, str]] = {}
    for n in names:
        stored = n.removeprefix("transformer.") if bare else n
        if stored in files:
            found[n] = (stored, files[stored])
    used = {s for s, _ in found.values()}
    # a tied model's file may hold lm_head.weight too: the head is the embedding, that copy is not read
    extra = [k for k in files if k not in used and not k.endswith(_BUFFERS) and k != "lm_head.weight"]
    return found, sorted(extra)


def tensor_shapes(path: Path, found: dict[str, tuple[str, str]]) -> dict[str, tuple[int, ...]]:
    """The stored shape of each found tensor, read from the file headers (no tensor data)."""
    out: dict[str, tuple[int, ...]] = {}
    by_file: dict[str, list[str]] = {}
    for n, (_, f) in found.items():
        by_file.setdefault(f, []).append(n)
    for f, ns in by_file.items():
        with safe_open(str(path / f), framework="numpy") as st:
            for n in ns:
                out[n] = tuple(st.get_slice(found[n][0]).get_shape())
    return out

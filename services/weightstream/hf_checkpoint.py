"""A Hugging Face model directory (``save_pretrained``) as the starting point of a run: its config, its
files, its tensor names and shapes.

Shared by the coordinator (which checks a directory against the params before anything starts:
``training/hf_start.py``) and MemoryX (which reads each of its own tensors from it, one at a time, so the
model is never whole in any process: ``memoryx.storage.start_tensors``). Safetensors: ``model.safetensors``,
or ``model-0000i-of-0000K.safetensors`` with ``model.safetensors.index.json`` (the layout our own
checkpoints share, so a weightstream checkpoint directory is a valid starting point too: its weights, not
its state). Where a directory has no safetensors, pickled torch files (``pytorch_model.bin``, or
``pytorch_model-0000i-of-0000K.bin`` with ``pytorch_model.bin.index.json``, what transformers < 5 wrote with
``safe_serialization=False``) are read with torch, where it is installed (the ``hf-bin`` extra):
``torch.load(weights_only=True, mmap=True)``, so unpickling runs no code and a tensor's bytes are read from
disk only when that tensor is converted. Without torch they are refused with the way to convert them.

Names: ours are Hugging Face's ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` names. A GPT-2 saved from the
bare ``GPT2Model`` (as the original ``gpt2`` files are) lacks the ``transformer.`` prefix; it is added.
Buffers some versions save (GPT-2's causal ``attn.bias`` / ``attn.masked_bias``, LLaMA's
``rotary_emb.inv_freq``) and a tied ``lm_head.weight`` are not weights of ours and are passed over.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

__all__ = ["StartCheckpointError", "bin_tensors", "read_config", "stored_names", "tensor_shapes"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_BIN_INDEX = "pytorch_model.bin.index.json"
_BIN_SINGLE = "pytorch_model.bin"
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
    """Stored tensor name -> file, from the index or the single file; safetensors first (as transformers)."""
    if (path / _INDEX).is_file():
        return _index(path / _INDEX)
    if (path / _SINGLE).is_file():
        with safe_open(str(path / _SINGLE), framework="numpy") as f:
            return dict.fromkeys(f.keys(), _SINGLE)
    if (path / _BIN_INDEX).is_file():  # torch is needed (and missing torch refused) to read its shapes
        return _index(path / _BIN_INDEX)
    if (path / _BIN_SINGLE).is_file():
        return dict.fromkeys(_load_bin(path / _BIN_SINGLE), _BIN_SINGLE)
    if any(path.glob("pytorch_model*.bin")):
        raise StartCheckpointError(f"{path} holds pytorch_model*.bin shards but no {_BIN_INDEX} naming them")
    raise StartCheckpointError(f"{path} has neither {_SINGLE} nor {_INDEX} (nor {_BIN_SINGLE})")


def _index(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StartCheckpointError(f"{index}: not a weights index ({e})") from None
    for f in set(weight_map.values()):
        if Path(f).name != f or not (index.parent / f).is_file():  # a name in the index, never a path out
            raise StartCheckpointError(f"{index} names {f!r}, which is not a file beside it")
    return dict(weight_map)


def _convert_hint(path: Path) -> str:
    return (
        'convert it once to safetensors where torch and transformers are installed: python -c "from '
        "transformers import AutoModelForCausalLM as M; "
        f"M.from_pretrained('{path}').save_pretrained('{path}-safetensors')\""
    )


def _torch(path: Path) -> Any:
    """The torch module, imported only for ``path``'s pickled files; else StartCheckpointError saying what
    to do."""
    try:
        import torch
    except ImportError:
        raise StartCheckpointError(
            f"{path} holds pytorch_model*.bin (pickled torch tensors): reading them needs torch, which is "
            "not installed here (the coordinator checks the files and every MemoryX server reads its "
            f"tensors from them). Install it (pip install 'weightstream[hf-bin]'), or {_convert_hint(path)}"
        ) from None
    return torch


def _load_bin(file: Path) -> dict[str, Any]:
    """A pytorch_model*.bin's state dict, memory-mapped: no tensor's bytes are read until it is used."""
    torch = _torch(file.parent)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises RuntimeError, pickle's UnpicklingError, OSError, ... alike
        raise StartCheckpointError(
            f"{file}: torch.load(weights_only=True, mmap=True) cannot read it ({e}). weightstream reads what "
            "torch.save writes (as save_pretrained(safe_serialization=False) did before transformers 5); or "
            f"{_convert_hint(file.parent)}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise StartCheckpointError(f"{file}: not a state dict (tensor names to tensors)")
    return state


def _by_file(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(name, file) pairs grouped as {file: names}, files in first-seen order: each file opened once."""
    out: dict[str, list[str]] = {}
    for name, f in pairs:
        out.setdefault(f, []).append(name)
    return out


def bin_tensors(path: Path, stored: Sequence[tuple[str, str]]) -> Iterator[tuple[str, np.ndarray]]:
    """The (stored name, file) tensors of a directory of pytorch_model*.bin files, one at a time, each a
    fresh writable float32 array: a file is opened (memory-mapped) once, for all of its tensors."""
    torch = _torch(path)
    for f, names in _by_file(stored).items():
        state = _load_bin(path / f)
        for name in names:
            # the one copy: out of the mapped file, into float32 (bf16 and fp16 files upcast exactly)
            yield name, state[name].detach().to(torch.float32, copy=True).numpy()
        del state


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
    for f, ns in _by_file((n, f) for n, (_, f) in found.items()).items():
        if f.endswith(".bin"):  # memory-mapped: the shapes come without the tensors' bytes
            state = _load_bin(path / f)
            out |= {n: tuple(state[found[n][0]].shape) for n in ns}
            continue
        with safe_open(str(path / f), framework="numpy") as st:
            for n in ns:
                out[n] = tuple(st.get_slice(found[n][0]).get_shape())
    return out

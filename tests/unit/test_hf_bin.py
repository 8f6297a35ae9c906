"""A Hugging Face directory of pickled torch files (pytorch_model.bin, or shards with their index) as a
starting checkpoint (hf_checkpoint.py, memoryx.storage.start_tensors): the same tensors as its
safetensors twin, read with torch.load(weights_only=True, mmap=True), and refused with a way out where
torch is missing.

transformers 5 no longer writes .bin files, so the tests write what transformers 4's
``save_pretrained(safe_serialization=False)`` wrote: config.json beside ``torch.save(state_dict)``, or
``pytorch_model-0000i-of-0000K.bin`` shards with ``pytorch_model.bin.index.json``."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.params_files import TINY_GPT2, TINY_LLAMA
from weightstream.hf_checkpoint import StartCheckpointError
from weightstream.memoryx.storage import start_tensors
from weightstream.params import load_params, model_def
from weightstream.training.hf_start import check_start_checkpoint

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) writes the .bin files: pip install -e .[test]"
)
transformers = pytest.importorskip("transformers", reason="the models saved: pip install -e .[test]")

# test_initializers' tiny models: GPT-2 with GPT2Config's default (tanh) GELU, so transformers' saved
# model computes what the params say
GPT2: dict[str, Any] = {
    **TINY_GPT2,
    "model": {**TINY_GPT2["model"], "nonlinearity": "gelu_new"},
    "runconfig": {"num_csx": 1, "max_steps": 1},
}
LLAMA: dict[str, Any] = {**GPT2, "model": TINY_LLAMA["model"]}


def _gpt2() -> Any:
    torch.manual_seed(0)
    shape = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 64}
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, bos_token_id=0, eos_token_id=0))


def _llama() -> Any:
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(cfg)


def _save_bin(model: Any, path: Path, shards: int = 1, dtype: Any = None) -> Path:
    """What transformers 4 wrote with safe_serialization=False: one pytorch_model.bin (a tied head and
    its embedding share storage in it), or ``shards`` files and their index."""
    model.config.save_pretrained(path)
    state = model.state_dict()
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    if shards == 1:
        torch.save(state, path / "pytorch_model.bin")
        return path
    names = list(state)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        f = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = names[i::shards]  # interleaved: the files do not hold the tensors in the model's order
        torch.save({k: state[k] for k in part}, path / f)
        weight_map |= dict.fromkeys(part, f)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return path


def _names(params: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    p = load_params(copy.deepcopy(params))
    model = model_def(p)
    return p, model, list(model.specs)


@pytest.mark.parametrize(
    "family,shards", [("gpt2", 1), ("gpt2", 3), ("llama", 1), ("llama", 2)], ids=lambda v: str(v)
)
def test_bin_starts_the_same_tensors_as_safetensors(family: str, shards: int, tmp_path: Path) -> None:
    hf = _gpt2() if family == "gpt2" else _llama()
    hf.save_pretrained(tmp_path / "st")
    binary = _save_bin(hf, tmp_path / "bin", shards)
    p, model, names = _names(GPT2 if family == "gpt2" else LLAMA)
    notes = check_start_checkpoint(p, model, binary)  # names and shapes, read from the .bin files
    assert f"{len(names)} tensors" in notes[0]
    ours = dict(start_tensors(binary, names))
    twin = dict(start_tensors(tmp_path / "st", names))
    assert list(ours) != names or shards == 1  # sharded: in the files' order, which is not the model's
    assert set(ours) == set(twin) == set(names)
    for n in names:
        assert ours[n].dtype == np.float32 and ours[n].flags.writeable, n
        assert np.array_equal(ours[n], twin[n]), n
    before = ours[names[0]].copy()
    ours[names[0]] += 1.0  # a copy of its own: the file and the next read are untouched
    assert np.array_equal(dict(start_tensors(binary, names[:1]))[names[0]], before)
    ours[names[0]] = before
    for f in binary.glob("*.bin"):  # nor does a change to the (memory-mapped) file reach what was read
        with f.open("r+b") as fh:
            fh.write(bytes(f.stat().st_size))
    for n in names:
        assert np.array_equal(ours[n], twin[n]), n


def test_bfloat16_bin_is_upcast_exactly(tmp_path: Path) -> None:
    hf = _llama()
    binary = _save_bin(hf, tmp_path / "bin", dtype=torch.bfloat16)
    _, _, names = _names(LLAMA)
    state = hf.state_dict()
    for n, w in start_tensors(binary, names):
        assert w.dtype == np.float32
        assert np.array_equal(w, state[n].to(torch.bfloat16).float().numpy()), n


def test_torch_load_is_memory_mapped_and_weights_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mmap: a tensor's bytes are read only when it is converted, so the file is never whole in memory."""
    binary = _save_bin(_gpt2(), tmp_path / "bin", shards=2)
    calls: list[dict[str, Any]] = []
    real = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    p, model, names = _names(GPT2)
    check_start_checkpoint(p, model, binary)
    list(start_tensors(binary, names))
    assert calls and all(c.get("mmap") is True and c.get("weights_only") is True for c in calls), calls


class _Trap:
    """Unpickling this runs open(marker, 'w'): what a malicious pickle could do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "w")


def test_a_pickle_that_runs_code_is_refused_without_running_it(tmp_path: Path) -> None:
    binary = _save_bin(_gpt2(), tmp_path / "bin")
    marker = tmp_path / "ran"
    state = torch.load(binary / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "trap": _Trap(marker)}, binary / "pytorch_model.bin")
    p, model, _ = _names(GPT2)
    with pytest.raises(StartCheckpointError, match=r"pytorch_model\.bin: torch\.load\(weights_only=True"):
        check_start_checkpoint(p, model, binary)
    assert not marker.exists()


def test_unreadable_or_unindexed_bin_files_are_refused(tmp_path: Path) -> None:
    p, model, _ = _names(GPT2)
    junk = tmp_path / "junk"
    _gpt2().config.save_pretrained(junk)
    (junk / "pytorch_model.bin").write_bytes(b"not a torch file")
    with pytest.raises(StartCheckpointError, match="save_pretrained") as info:
        check_start_checkpoint(p, model, junk)
    assert f"{junk / 'pytorch_model.bin'}: torch.load" in str(info.value)
    torch.save({"w": torch.zeros(2), "step": 3}, junk / "pytorch_model.bin")  # loads, but not tensors only
    with pytest.raises(StartCheckpointError, match="not a state dict"):
        check_start_checkpoint(p, model, junk)
    shards = _save_bin(_gpt2(), tmp_path / "shards", shards=2)
    (shards / "pytorch_model.bin.index.json").unlink()
    with pytest.raises(StartCheckpointError, match=r"shards but no pytorch_model\.bin\.index\.json"):
        check_start_checkpoint(p, model, shards)


@pytest.mark.parametrize("shards", [1, 2])
def test_without_torch_bin_is_refused_saying_how_to_convert(
    shards: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _save_bin(_gpt2(), tmp_path / "bin", shards)
    p, model, names = _names(GPT2)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as if not installed
    for attempt in (
        lambda: check_start_checkpoint(p, model, binary),
        lambda: list(start_tensors(binary, names)),
    ):
        with pytest.raises(StartCheckpointError) as info:
            attempt()
        message = str(info.value)
        assert f"{binary} holds pytorch_model*.bin" in message and "torch, which is not installed" in message
        assert "pip install 'weightstream[hf-bin]'" in message
        assert f"M.from_pretrained('{binary}').save_pretrained('{binary}-safetensors')" in message


def test_safetensors_beside_bin_are_read_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As transformers does, safetensors win where both are there; torch is then not needed at all."""
    hf = _gpt2()
    both = _save_bin(hf, tmp_path / "both")
    hf.save_pretrained(both)
    p, model, names = _names(GPT2)
    monkeypatch.setitem(sys.modules, "torch", None)
    check_start_checkpoint(p, model, both)
    assert len(list(start_tensors(both, names))) == len(names)

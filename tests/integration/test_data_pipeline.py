"""The data pipeline as a user runs it, every step a real command: `weightstream tokenizer-train` on a
corpus, `weightstream data-preprocess` of .txt and of .jsonl into ModelZoo's HDF5 layout, a LLaMA params
file with GptHDF5MapDataProcessor trained by `weightstream run --num_csx 2`, and the checkpoint loaded in
transformers with the tokenizer, generating text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest
import yaml

from tests.integration.appliance import metrics, run, weightstream_cmd
from weightstream.params.trainer_layout import from_trainer

ROOT = Path(__file__).parents[2]
VOCAB, MSL = 512, 64


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*weightstream_cmd(), *args], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    return r


def _corpus(tmp: Path) -> tuple[Path, Path, Path]:
    """The Python documentation's topics that ship with Python (English that does not change from one
    commit of ours to the next): 30 topics as .txt files (train), the same text's paragraphs as .jsonl
    records (train too), the next 5 held out (eval)."""
    names = sorted(topics)
    train_txt, train_jsonl, held = tmp / "corpus" / "txt", tmp / "corpus" / "jsonl", tmp / "corpus" / "eval"
    for d in (train_txt, train_jsonl, held):
        d.mkdir(parents=True)
    for i, name in enumerate(names[:30]):
        (train_txt / f"{i:03d}.txt").write_text(topics[name], encoding="utf-8")
    paragraphs = [p for name in names[:30] for p in topics[name].split("\n\n") if p.strip()]
    with (train_jsonl / "paragraphs.jsonl").open("w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"id": len(p), "content": p}) + "\n")
    for i, name in enumerate(names[30:35]):
        (held / f"{i:03d}.txt").write_text(topics[name], encoding="utf-8")
    return train_txt, train_jsonl, held


@pytest.mark.slow  # ~10 s: in .ci/run's slow phase, keeping the default suite short
def test_tokenize_preprocess_train_llama_and_generate(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    torch = pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    train_txt, train_jsonl, held = _corpus(tmp_path)
    tok = tmp_path / "tokenizer.json"
    _cli("tokenizer-train", "--input", str(train_txt), "--vocab_size", str(VOCAB), "--output", str(tok))
    data = tmp_path / "data"
    for name, corpus, extra in (
        ("txt", train_txt, []),
        ("jsonl", train_jsonl, ["--jsonl_key", "content"]),
        ("eval", held, []),
    ):
        r = _cli(
            "data-preprocess", "--input", str(corpus), "--tokenizer", str(tok),
            "--max_sequence_length", str(MSL), "--output", str(data / name), *extra,
        )  # fmt: skip
        assert "samples" in r.stdout
        files = sorted((data / name).glob("*.h5"))
        assert files and (data / name / "data_params.json").is_file()
        for f in files:
            with h5py.File(f, "r") as h:
                d = h["data"][...]
                assert d.ndim == 3 and d.shape[1:] == (3, MSL) and int(h.attrs["n_examples"]) == len(d)
                assert d[:, 0].min() >= 0 and d[:, 0].max() < VOCAB and d[:, 2].max() < VOCAB

    shipped = yaml.safe_load((ROOT / "services/weightstream/examples/llama_tiny.yaml").read_text())
    params = from_trainer(shipped).legacy  # the example is in the trainer: layout; edited here as legacy
    params["train_input"].update(mixture=[{"data_dir": str(data / "txt")}, {"data_dir": str(data / "jsonl")}])
    del params["train_input"]["data_dir"]
    params["train_input"].update(batch_size=32, max_sequence_length=MSL)
    params["eval_input"].update(data_dir=str(data / "eval"), batch_size=8, max_sequence_length=MSL)
    params["model"].update(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, filter_size=172,
                           max_position_embeddings=MSL)  # fmt: skip
    params["optimizer"]["learning_rate"] = [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-2, "total_iters": 10},
        {
            "scheduler": "CosineDecay",
            "initial_learning_rate": 1e-2,
            "end_learning_rate": 1e-3,
            "total_iters": 90,
        },
    ]
    params["runconfig"].update(max_steps=100, log_steps=1, eval_frequency=0, eval_steps=1)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    r = run(path, tmp_path / "m", "--num_csx", "2")
    assert r.returncode == 0, r.stderr
    losses, evals = metrics(tmp_path / "m")
    # the bar for learning real text: down 20% in 100 steps
    assert losses[100] < 0.8 * losses[1], (losses[1], losses[100])
    assert evals[100] < 0.8 * np.log(VOCAB)

    # the checkpoint and the tokenizer, as a transformers user has them: generate a few tokens
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m" / "checkpoint_100").eval()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok))
    ids = tokenizer("The appliance", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + 8
    assert isinstance(tokenizer.decode(out[0]), str)

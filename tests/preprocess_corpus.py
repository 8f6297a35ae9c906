"""The corpus and helpers the data-preprocess tests share: real prose (the documentation pages' paragraphs
and our docstrings; nothing downloaded), the reference token stream, and readers of the output."""

from __future__ import annotations

import importlib
from pathlib import Path

import h5py
import numpy as np
import psutil
from tokenizers import Tokenizer

from weightstream.data.tokenizer import EOS_TOKEN

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 700
MSL = 64
EOT_DOC = f"A document may mention {EOS_TOKEN} in its text; that is text, not the end."
UNICODE_DOC = "Naïve café résumé: 東京とカフェ, emoji 🚀 and ß, written by hand."


def _paragraphs() -> list[str]:
    """Real English prose: the paragraphs of the documentation pages (docs/*.md in name order, so the corpus
    is the same on every machine) and our modules' docstrings. Code blocks and tables are left out."""
    paras = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        blocks = page.read_text(encoding="utf-8").split("\n\n")
        paras += [
            p.strip() for p in blocks if len(p.strip()) > 120 and not p.lstrip().startswith(("```", "|"))
        ]
    for name in ("weightstream", "weightstream.data.processors", "weightstream.simulate", "weightstream.cli"):
        doc = importlib.import_module(name).__doc__
        assert doc is not None, name
        paras.append(doc.strip())
    return paras


def _expected_stream(tokenizer: Path, docs: list[str]) -> np.ndarray:
    """The reference: each document encoded on its own, the end-of-document id after it."""
    tok = Tokenizer.from_file(str(tokenizer))
    tok.encode_special_tokens = True
    eos = tok.token_to_id(EOS_TOKEN)
    return np.array([i for d in docs for i in [*tok.encode(d, add_special_tokens=False).ids, eos]])


def _read(out: Path) -> np.ndarray:
    """Every sample of an output directory, files in name order, checking ModelZoo's layout."""
    blocks = []
    names = sorted(p.name for p in out.glob("*.h5"))
    for i, name in enumerate(names):
        assert name == f"data-{i:05d}.h5"
        with h5py.File(out / name, "r") as f:
            data = f["data"]
            assert data.dtype == np.int32 and data.ndim == 3 and data.shape[1:] == (3, MSL)
            assert data.chunks == (1, 3, MSL) and data.compression == "gzip"
            assert f.attrs["n_examples"] == data.shape[0]
            blocks.append(data[()])
    return np.concatenate(blocks)


def _stream_of(data: np.ndarray) -> np.ndarray:
    """The token stream samples [n, 3, T] were cut from: every input that has a label, then the last label."""
    x, mask, y = data[:, 0], data[:, 1], data[:, 2]
    return np.concatenate([x[mask == 1], y[-1][mask[-1] == 1][-1:]])


def _tokenizer_processes() -> list[psutil.Process]:
    """Our child processes, but for multiprocessing's resource tracker (it lives as long as we do)."""
    return [c for c in psutil.Process().children() if "resource_tracker" not in " ".join(c.cmdline())]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))

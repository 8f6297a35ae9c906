"""The data-preprocess tests' corpus (written here, in every file type the command reads) and the
tokenizer trained on it, once per test module."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.unit.data.preprocess_corpus import EOT_DOC, UNICODE_DOC, VOCAB, _paragraphs
from weightstream.data.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """The corpus directory, its documents in the order preprocessing must read them, and where each is
    (file:line)."""
    paras = _paragraphs()
    assert len(paras) > 60
    d = tmp_path_factory.mktemp("corpus")
    (d / "a_note.txt").write_text(UNICODE_DOC, encoding="utf-8")  # short: its largest id is not the largest
    (d / "b_intro.txt").write_text(text := "\n\n".join(paras[:5]), encoding="utf-8")
    records = [{"text": p, "id": i} for i, p in enumerate(paras[5:35])] + [{"text": ""}]  # empty: skipped
    (d / "c_records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    with gzip.open(d / "d_more.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": p}) + "\n" for p in paras[35:])
    (d / "sub").mkdir()
    (d / "sub" / "e_deep.txt").write_text(paras[0], encoding="utf-8")
    (d / "x_eot.txt").write_text(EOT_DOC, encoding="utf-8")
    (d / "README.md").write_text("not a corpus file: ignored")
    (d / "empty.txt").write_text("")  # no document
    docs = [UNICODE_DOC, text, *paras[5:35], *paras[35:], paras[0], EOT_DOC]
    where = ["a_note.txt:1", "b_intro.txt:1"]
    where += [f"c_records.jsonl:{i}" for i in range(1, 31)] + [
        f"d_more.jsonl.gz:{i}" for i in range(1, 1 + len(paras[35:]))
    ]
    where += ["sub/e_deep.txt:1", "x_eot.txt:1"]
    return d, docs, where


@pytest.fixture(scope="module")
def tokenizer(corpus: tuple[Path, list[str], list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    result = train_tokenizer([corpus[0]], VOCAB, out)
    assert result.path == out and result.documents == len(corpus[1]) and result.files == 7
    return out

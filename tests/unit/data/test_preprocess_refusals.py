"""``data-preprocess`` refusals: bad input is refused naming the file and line, bad options by name, and a
refused run leaves nothing that looks complete (the output directory is replaced only with
``--overwrite``). Interrupted and killed runs are in tests/integration/data/test_preprocess_refusals.py."""

from __future__ import annotations

import dataclasses
import gzip
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.preprocess_corpus import (
    MSL,
    _leftovers,
)
from weightstream.data import preprocess as pp
from weightstream.data.documents import DataPreprocessError
from weightstream.data.tokenizer import load_tokenizer

# ---------------------------------------------------------------------------------------------------------
# Refusals: each names the file and line, and leaves no output behind
# ---------------------------------------------------------------------------------------------------------
BAD_CASES: dict[str, tuple[dict[str, str | bytes], str]] = {  # name: (corpus files, what the error says)
    "not json": (
        {"ok.jsonl": '{"text": "fine"}\n{"text": "fine"}\n{"text": broken\n'},
        r"ok.jsonl:3: not JSON",
    ),
    "no key": (
        {"a.jsonl": '{"text": "x"}\n{"body": "x", "id": 2}\n'},
        r"a.jsonl:2: no key 'text' \(keys: 'body', 'id'\); choose the key with --jsonl_key",
    ),
    "not a string": ({"a.jsonl": '{"text": 42}\n'}, r"a.jsonl:1: 'text' is a JSON int, expected a string"),
    "not an object": ({"a.jsonl": '["text"]\n'}, r"a.jsonl:1: a JSON list, expected an object"),
    "binary .txt": (
        {"bin.txt": b"ok line\nbad \xff\xfe here"},
        r"bin.txt:2: not UTF-8 text: byte 0xff at byte offset 12",
    ),
    "binary .jsonl.gz": (
        {"z.jsonl.gz": b'{"text": "a"}\n{"text": "\xc3("}\n'},
        r"z.jsonl.gz:2: not UTF-8 text: byte 0xc3 at byte offset 24",
    ),
    "bad gzip": ({"z.jsonl.gz": b"this is not gzip"}, r"z.jsonl.gz: cannot read: "),
    "empty dir": ({}, r"in: no corpus files: the directory is empty"),
    "no supported files": (
        {"a.md": "x", "b.json": "{}"},
        r"in: no corpus files: none of its 2 files is .txt, .jsonl, .jsonl.gz",
    ),
    "only empty documents": (
        {"a.txt": "", "b.jsonl": '{"text": ""}\n'},
        r"in: no documents: its 2 corpus files hold no text",
    ),
}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_refused_naming_file_and_line(case: str, tokenizer: Path, tmp_path: Path) -> None:
    files, message = BAD_CASES[case]
    corpus = tmp_path / "in"
    corpus.mkdir()
    for name, content in files.items():
        if name.endswith(".gz") and case != "bad gzip":
            assert isinstance(content, bytes)
            content = gzip.compress(content)
        (corpus / name).write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(DataPreprocessError, match=message) as e:
        pp.preprocess(corpus, tokenizer, MSL, tmp_path / "out", num_processes=1)
    assert isinstance(e.value, ValueError)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_bad_options_are_refused(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    with pytest.raises(DataPreprocessError, match=r"max_sequence_length 1: expected at least 2"):
        pp.preprocess(corpus[0], tokenizer, 1, tmp_path / "out")
    with pytest.raises(DataPreprocessError, match=r"nothere: not a directory"):
        pp.preprocess(tmp_path / "nothere", tokenizer, MSL, tmp_path / "out")
    with pytest.raises(DataPreprocessError, match=r"nothere.json: no such tokenizer file"):
        pp.preprocess(corpus[0], tmp_path / "nothere.json", MSL, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_token_id_beyond_the_vocabulary_is_refused(
    corpus: tuple[Path, list[str], list[str]],
    tokenizer: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a vocabulary that covers the first documents: the first one with a larger id is named
    tok = Tokenizer.from_file(str(tokenizer))
    tok.encode_special_tokens = True
    ids = [tok.encode(d).ids for d in corpus[1]]
    top = max(ids[0])
    first = next(k for k, x in enumerate(ids) if max(x) > top)
    bad = next(i for i in ids[first] if i > top)  # the first id of the stream above every id before it
    assert first > 0
    small = dataclasses.replace(load_tokenizer(tokenizer), vocab_size=bad)  # so it is exactly the size
    monkeypatch.setattr(pp, "load_tokenizer", lambda *a, **k: small)
    message = f"{corpus[2][first]}: token id {bad} is out of range for the tokenizer's vocab size {bad}"
    with pytest.raises(DataPreprocessError, match=re.escape(message)):
        pp.preprocess(corpus[0], tokenizer, MSL, tmp_path / "out", num_processes=1)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


def test_the_output_directory_is_replaced_only_with_overwrite(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    pp.preprocess(corpus[0], tokenizer, MSL, out, num_processes=1)
    (out / "data-00099.h5").write_bytes(b"stale")
    with pytest.raises(
        DataPreprocessError, match=r"out: the output directory is not empty; pass --overwrite"
    ):
        pp.preprocess(corpus[0], tokenizer, MSL, out, num_processes=1)
    assert (out / "data-00099.h5").exists()
    pp.preprocess(corpus[0], tokenizer, MSL, out, num_processes=1, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["data-00000.h5", "data_params.json"]
    (out / "notes.txt").write_text("mine")  # not ours to delete
    with pytest.raises(DataPreprocessError, match=r"holds files other than .h5 and data_params.json"):
        pp.preprocess(corpus[0], tokenizer, MSL, out, num_processes=1, overwrite=True)
    assert (out / "notes.txt").exists() and _leftovers(tmp_path) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataPreprocessError, match=r"afile: exists and is not a directory"):
        pp.preprocess(corpus[0], tokenizer, MSL, tmp_path / "afile", num_processes=1)

"""``tokenizer-train`` and ``data-preprocess`` with processes: the output does not depend on the process
count, the corpus is never read far ahead of what is written, and the commands run (and refuse with exit
2) as a user runs them, out of process with a process pool. The rest is in
tests/unit/data/test_preprocess.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from tokenizers import Tokenizer
from typer.testing import CliRunner

from tests.preprocess_corpus import (
    MSL,
    _read,
)
from weightstream.data import preprocess as pp
from weightstream.data.cli import data_preprocess, tokenizer_train
from weightstream.data.documents import Document


# ---------------------------------------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------------------------------------
def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("tokenizer-train")(tokenizer_train)
    app.command("data-preprocess")(data_preprocess)
    return app


def test_output_is_deterministic_and_independent_of_the_process_count(
    corpus: tuple[Path, list[str], list[str]],
    tokenizer: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pp, "BATCH_CHARS", 3000)  # ~30 tokenizing tasks: results must be taken in order
    runs = {
        name: _read(pp.preprocess(corpus[0], tokenizer, MSL, tmp_path / name, num_processes=p).output_dir)
        for name, p in (("one", 1), ("again", 1), ("two", 2), ("default", None))
    }
    assert runs["one"].tobytes() == runs["again"].tobytes() == runs["two"].tobytes()
    assert runs["default"].tobytes() == runs["one"].tobytes()
    setup = json.loads((tmp_path / "default" / "data_params.json").read_text())["setup"]
    assert setup["processes"] == len(os.sched_getaffinity(0))  # the cores we may use, not the machine's


def test_the_corpus_is_never_read_far_ahead_of_what_is_written(tokenizer: Path) -> None:
    consumed = 0

    def batches() -> Iterator[list[Document]]:
        nonlocal consumed
        for i in range(12):
            consumed += 1
            yield [Document(f"document number {i}", Path("x.txt"), i + 1)]

    tokenizer_json = Tokenizer.from_file(str(tokenizer)).to_str()
    for processes in (1, 2):
        consumed = 0
        for k, (batch, stream, _) in enumerate(pp._encoded(batches(), tokenizer_json, 7, processes)):
            # in flight: nothing beyond the batch at hand in this process, two tasks per pool process
            assert consumed == (k + 1 if processes == 1 else min(12, k + 2 * processes))
            assert batch[0].line == k + 1 and stream[-1] == 7 and 7 not in stream[:-1]


def test_commands_train_preprocess_and_refuse_with_exit_2(
    corpus: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    runner, app = CliRunner(), _app()
    tok = tmp_path / "tok" / "tokenizer.json"
    r = runner.invoke(
        app, ["tokenizer-train", "--input", str(corpus[0]), "--vocab_size", "300", "--output", str(tok)]
    )
    assert r.exit_code == 0, r.output
    assert (
        f"tokenizer {tok}: 300 tokens, <|endoftext|> = 0, trained on {len(corpus[1])} documents" in r.output
    )
    args = [
        "data-preprocess",
        "--input",
        str(corpus[0]),
        "--tokenizer",
        str(tok),
        "--max_sequence_length",
        "32",
    ]
    r = runner.invoke(app, [*args, "--output", str(tmp_path / "out"), "--num_processes", "1"])
    assert r.exit_code == 0, r.output
    summary = r.stdout.replace("\n", " ")
    assert f"samples of 32 tokens in 1 file, from {len(corpus[1])} documents in 7 files (" in summary
    assert summary.rstrip().endswith("vocab_size 300, eos_id 0, pad_id 0; ignored 1 file of other kinds")
    assert (tmp_path / "out" / "data-00000.h5").is_file()
    r = runner.invoke(app, [*args, "--output", str(tmp_path / "out")])
    assert r.exit_code == 2 and "error: " in r.stderr and "pass --overwrite" in r.stderr
    r = runner.invoke(app, [*args, "--output", str(tmp_path / "out2"), "--jsonl_key", "body"])
    assert r.exit_code == 2 and "c_records.jsonl:1: no key 'body'" in r.stderr
    r = runner.invoke(
        app, ["tokenizer-train", "--input", str(corpus[0]), "--vocab_size", "9", "--output", str(tok)]
    )
    assert r.exit_code == 2 and "vocab_size 9: expected at least 257" in r.stderr
    r = runner.invoke(app, ["data-preprocess", "--input", str(corpus[0])])  # required options missing
    assert r.exit_code == 2 and "--tokenizer" in r.output


def test_commands_run_out_of_process_with_a_process_pool(
    corpus: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    register = (
        "import typer; from weightstream.data.cli import tokenizer_train, data_preprocess; "
        "app = typer.Typer(); app.command('tokenizer-train')(tokenizer_train); "
        "app.command('data-preprocess')(data_preprocess); app()"
    )
    tok, out = tmp_path / "tokenizer.json", tmp_path / "out"
    cmd = [sys.executable, "-c", register]
    train = [*cmd, "tokenizer-train", "--input", str(corpus[0]), "--vocab_size", "300", "--output", str(tok)]
    r = subprocess.run(train, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "300 tokens" in r.stdout, r.stderr
    args = ["--input", str(corpus[0]), "--tokenizer", str(tok), "--max_sequence_length", "32"]
    run = [*cmd, "data-preprocess", *args, "--output", str(out), "--num_processes", "2"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "tokens/s" in r.stdout, r.stderr
    assert json.loads((out / "data_params.json").read_text())["setup"]["processes"] == 2
    r = subprocess.run([*run[:-4], "--max_sequence_length", "1", "--output", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "error: max_sequence_length 1: expected at least 2" in r.stderr

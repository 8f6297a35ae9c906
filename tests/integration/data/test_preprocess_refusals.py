"""``data-preprocess`` runs interrupted or killed in a process of their own leave nothing that looks
complete. The other refusals are in tests/unit/data/test_preprocess_refusals.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.preprocess_corpus import (
    MSL,
    _leftovers,
    _tokenizer_processes,
)
from weightstream.data import preprocess as pp
from weightstream.data.documents import DataPreprocessError


def test_an_interrupted_run_leaves_nothing_that_looks_complete(
    corpus: tuple[Path, list[str], list[str]],
    tokenizer: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a bad line in the last file, after several .h5 files were already written
    bad = tmp_path / "in"
    bad.mkdir()
    for p in corpus[0].glob("*.jsonl*"):
        (bad / p.name).write_bytes(p.read_bytes())
    (bad / "z_last.jsonl").write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    monkeypatch.setattr(pp, "BATCH_CHARS", 2000)
    written: list[int] = []

    def watch(p: pp.PreprocessProgress) -> None:
        written.append(len(list(tmp_path.glob(".out.tmp-*/data-*.h5"))))

    with pytest.raises(DataPreprocessError, match=r"z_last.jsonl:2: no key 'text'"):
        pp.preprocess(
            bad, tokenizer, MSL, tmp_path / "out", num_processes=2, samples_per_file=10, progress=watch
        )
    assert max(written) >= 3  # files were written before the error: all of them are gone
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()
    assert _tokenizer_processes() == []  # and so are the tokenizer processes

    # Ctrl-C (or any exception) from the caller mid-way: the same
    def interrupt(p: pp.PreprocessProgress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as held:  # a caller holding the traceback (and its frames)
        pp.preprocess(corpus[0], tokenizer, MSL, tmp_path / "out", num_processes=2, progress=interrupt)
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out").exists()
    assert _tokenizer_processes() == [] and held.traceback  # stopped, not left to the garbage collector


def test_a_killed_run_leaves_only_a_hidden_unfinished_directory(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    script = f"""
import os, signal
from pathlib import Path
from weightstream.data import preprocess as pp
pp.BATCH_CHARS = 2000
def progress(p):
    if list(Path({str(tmp_path)!r}).glob(".out.tmp-*/data-00001.h5")):
        os.kill(os.getpid(), signal.SIGKILL)
pp.preprocess(Path({str(corpus[0])!r}), Path({str(tokenizer)!r}), {MSL}, Path({str(tmp_path / "out")!r}),
              num_processes=1, samples_per_file=10, progress=progress)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (tmp_path / "out").exists()
    (left,) = [tmp_path / n for n in _leftovers(tmp_path)]
    assert left.name.startswith(".out.tmp-") and not (left / "data_params.json").exists()

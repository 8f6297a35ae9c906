"""Shared fixtures. Tests that need an optional tool skip with the reason, never pass silently."""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import weightstream  # noqa: F401  (first: it picks numpy's OpenBLAS kernels before numpy loads them)

# isort: split
import numpy as np
import pytest

# PyTorch (the tests' reference) before anything computes a product: it exports the symbols of the MKL it
# links, and imported after the workers' sequential MKL has loaded (numerics/_gemm.py) it would bind to
# that one and run on one thread, slowing every torch reference computed afterwards.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def maps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the read-only memfd mappings (a receiver's, transport/shm.py) made while the test runs."""
    import weightstream.transport.shm as shm_module

    made: list[int] = []
    original = shm_module._map

    def counted(fd: int, size: int, *args: Any, **kw: Any) -> np.ndarray:
        if not kw["writable"]:
            made.append(size)
        return original(fd, size, *args, **kw)

    monkeypatch.setattr(shm_module, "_map", counted)
    return made


@pytest.fixture
def peers_share_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every peer a role asks, when it is built, for its host (transport/peers.py) answers as a role on
    this host whose memfds map: for tests that build roles whose peers' addresses point nowhere
    (``tests.role_jobs``), on the shared-memory plane."""
    import weightstream.transport.peers as peers
    from tests.role_jobs import CREDENTIAL
    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.transport.shm import job_tag

    probe = peers.MemfdProbe(job_tag(CREDENTIAL))
    reply = pb.HealthReply(host=probe.identity, probe_pid=probe.pid, probe_fd=probe.fd)
    monkeypatch.setattr(peers, "ask_peer", lambda address, token: reply)
    yield
    probe.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """The data-preprocess tests' corpus (tests/preprocess_corpus.py), written once per test module in every
    file type the command reads: its directory, its documents in the order preprocessing must read them, and
    where each is (file:line)."""
    from tests.preprocess_corpus import EOT_DOC, UNICODE_DOC, _paragraphs

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
    """The tokenizer.json of a byte-level BPE trained on ``corpus``, once per test module."""
    from tests.preprocess_corpus import VOCAB
    from weightstream.data.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    result = train_tokenizer([corpus[0]], VOCAB, out)
    assert result.path == out and result.documents == len(corpus[1]) and result.files == 7
    return out

"""``tokenizer-train`` and ``data-preprocess``: a byte-level BPE trained here, and a corpus of .txt, .jsonl
and .jsonl.gz written here (paragraphs of the docs pages and our docstrings; nothing downloaded) turned into
ModelZoo-layout HDF5. The token stream is checked against the tokenizer run document by document, the
packing against its definition, and every refusal for the file and line it names and for leaving nothing
behind. What needs processes (a process pool, the commands run as a user runs them) is in
tests/integration/data/test_preprocess.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tests.preprocess_corpus import (
    MSL,
    VOCAB,
    _expected_stream,
    _leftovers,
    _read,
    _stream_of,
)
from weightstream.data import preprocess as pp
from weightstream.data.documents import DataPreprocessError
from weightstream.data.tokenizer import EOS_TOKEN, load_tokenizer, train_tokenizer


# ---------------------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------------------
def test_trained_tokenizer_round_trips_and_loads_in_transformers(
    tokenizer: Path, corpus: tuple[Path, list[str], list[str]]
) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(tokenizer))
    assert tok.get_vocab_size() == VOCAB
    assert tok.token_to_id(EOS_TOKEN) == 0
    unseen = "Zebras quizzically jog: ¿qué? ✓ 한국어 ∑∫ 🎉 \t\n  trailing  "  # bytes never in the corpus
    for text in [*corpus[1], unseen]:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer))
    assert len(fast) == VOCAB
    assert fast.encode(corpus[1][2]) == tok.encode(corpus[1][2]).ids
    assert fast.convert_tokens_to_ids(EOS_TOKEN) == 0
    assert oct(tokenizer.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("vocab", [257, 400])
def test_vocab_size_is_respected(
    vocab: int, corpus: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    result = train_tokenizer([corpus[0]], vocab, tmp_path)  # a directory: tokenizer.json inside
    assert result.path == tmp_path / "tokenizer.json"
    assert result.vocab_size == vocab == Tokenizer.from_file(str(result.path)).get_vocab_size()


def test_training_is_deterministic(corpus: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    a = train_tokenizer([corpus[0]], 500, tmp_path / "a.json").path.read_bytes()
    assert a == train_tokenizer([corpus[0]], 500, tmp_path / "b.json").path.read_bytes()


def test_vocab_size_below_the_byte_alphabet_is_refused(
    corpus: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    with pytest.raises(DataPreprocessError, match=r"vocab_size 256: expected at least 257"):
        train_tokenizer([corpus[0]], 256, tmp_path / "t.json")
    with pytest.raises(
        DataPreprocessError, match=r"README.md: not a corpus file \(.txt, .jsonl, .jsonl.gz\)"
    ):
        train_tokenizer([corpus[0] / "README.md"], 300, tmp_path / "t.json")
    with pytest.raises(DataPreprocessError, match=r"nope: no such file or directory"):
        train_tokenizer([tmp_path / "nope"], 300, tmp_path / "t.json")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "typo"}\n')
    with pytest.raises(DataPreprocessError, match=r"bad.jsonl:2: no key 'text'"):
        train_tokenizer([tmp_path / "bad.jsonl"], 300, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def _tiny_tokenizer(path: Path, specials: list[str]) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_tokens(["hello", "world"])
    tok.add_special_tokens(specials)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def test_load_tokenizer_finds_the_end_of_document_token(tmp_path: Path) -> None:
    llama = _tiny_tokenizer(tmp_path / "llama", ["<s>", "</s>", "<pad>", "<eos>"])
    t = load_tokenizer(llama.parent)  # a model directory works too; "</s>" comes before "<eos>"
    assert (t.eos_token, t.eos_id, t.pad_token, t.pad_id, t.vocab_size) == ("</s>", 3, "</s>", 3, 6)
    (llama.parent / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<s>", "pad_token": "<pad>"})
    )
    t = load_tokenizer(llama)
    assert (t.eos_token, t.eos_id, t.pad_token, t.pad_id) == ("<s>", 2, "<pad>", 4)
    t = load_tokenizer(llama, eos_token="<pad>")  # the explicit choice wins over the config
    assert (t.eos_token, t.eos_id) == ("<pad>", 4)
    with pytest.raises(
        DataPreprocessError, match=r"tokenizer.json: the end-of-document token '<eot>' is not"
    ):
        load_tokenizer(llama, eos_token="<eot>")
    bare = _tiny_tokenizer(tmp_path / "bare", ["<unk>"])
    with pytest.raises(DataPreprocessError, match=re.escape(f"{bare}: no end-of-document token: none of <|")):
        load_tokenizer(bare)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(DataPreprocessError, match=r"junk.json: not a Hugging Face tokenizer.json"):
        load_tokenizer(tmp_path / "junk.json")


# ---------------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [1, 2, 5, 9, 10, 11, 12, 40, 41, 42, 57])
def test_pack_windows_of_T_plus_1_at_stride_T_and_pads_the_rest(length: int) -> None:
    T, pad = 8, 99
    stream = np.arange(100, 100 + length, dtype=np.int32)
    out = pp.pack(stream, T, pad)
    n_full, rest = (length - 1) // T, length - ((length - 1) // T) * T
    assert out.shape == (n_full + (rest >= 2), 3, T) and out.dtype == np.int32
    for k in range(n_full):
        np.testing.assert_array_equal(out[k, 0], stream[k * T : k * T + T])
        np.testing.assert_array_equal(out[k, 2], stream[k * T + 1 : k * T + T + 1])
        assert (out[k, 1] == 1).all()
    if rest >= 2:
        r = rest - 1
        np.testing.assert_array_equal(out[-1, 0], [*stream[n_full * T : n_full * T + r], *[pad] * (T - r)])
        np.testing.assert_array_equal(out[-1, 2], [*stream[n_full * T + 1 :], *[pad] * (T - r)])
        np.testing.assert_array_equal(out[-1, 1], [1] * r + [0] * (T - r))


def test_packing_does_not_depend_on_how_the_stream_arrives(rng: np.random.Generator) -> None:
    stream = rng.integers(0, 500, size=1000).astype(np.int32)
    packer = pp.Packer(16, 0)
    cuts = np.sort(rng.choice(np.arange(1, 1000), size=40, replace=False))
    pieces = [packer.push(part) for part in np.split(stream, cuts)]
    np.testing.assert_array_equal(np.concatenate([*pieces, packer.finish()]), pp.pack(stream, 16, 0))


# ---------------------------------------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------------------------------------
def test_preprocess_writes_modelzoo_hdf5_of_the_packed_stream(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    seen: list[pp.PreprocessProgress] = []
    s = pp.preprocess(
        corpus[0], tokenizer, MSL, out, num_processes=1, samples_per_file=50, progress=seen.append
    )
    expected = _expected_stream(tokenizer, corpus[1])
    data = _read(out)  # [n, 3, T]
    x, mask, y = data[:, 0], data[:, 1], data[:, 2]
    assert (data < VOCAB).all() and (data >= 0).all()
    # the documents, in sorted file order, each followed by <|endoftext|> = 0, and nothing else
    np.testing.assert_array_equal(_stream_of(data), expected)
    assert np.count_nonzero(expected == 0) == len(corpus[1])  # the literal "<|endoftext|>" stayed text
    # labels are the inputs shifted by one, across sample (and file) boundaries too
    np.testing.assert_array_equal(y[:, :-1][mask[:, 1:] == 1], x[:, 1:][mask[:, 1:] == 1])
    np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])
    # the mask is 0 exactly on the padding at the end (where input and label are the pad id)
    real = len(expected) - 1  # positions with a label: all but the stream's last token
    np.testing.assert_array_equal(mask.ravel(), np.arange(mask.size) < real)
    assert (x.ravel()[real:] == s.pad_id).all() and (y.ravel()[real:] == s.pad_id).all() and s.pad_id == 0
    assert len(data) == s.samples == -(-real // MSL)
    assert s.files == [f"data-{i:05d}.h5" for i in range((s.samples + 49) // 50)] and len(s.files) > 2
    assert (s.documents, s.tokens, s.input_files, s.ignored_files) == (len(corpus[1]), len(expected), 7, 1)
    with h5py.File(out / "data-00000.h5") as f:
        attrs = {k: int(f.attrs[k]) for k in ("n_examples", "vocab_size", "max_sequence_length", "eos_id")}
        assert attrs == {"n_examples": 50, "vocab_size": VOCAB, "max_sequence_length": MSL, "eos_id": 0}
        assert int(f.attrs["pad_id"]) == 0
    params = json.loads((out / "data_params.json").read_text())
    assert params["setup"] == {
        "mode": "pretraining", "input_dir": str(corpus[0]), "output_dir": str(out), "processes": 1,
    }  # fmt: skip
    ours = params["weightstream"]
    assert (ours["documents"], ours["tokens"], ours["samples"], ours["files"]) == (
        len(corpus[1]), len(expected), s.samples, s.files,
    )  # fmt: skip
    assert ours["options"]["input"] == str(corpus[0]) and ours["options"]["max_sequence_length"] == MSL
    assert params["post-process"]["n_examples"] == s.samples and params["processing"]["vocab_size"] == VOCAB
    assert params["h5_dataset_stats"]["loss_valid_tokens"] == len(expected) - 1
    assert params["processing"]["huggingface_tokenizer"] == str(tokenizer)
    assert [p.files_done for p in seen][-1] == 7 and seen[-1].documents == len(corpus[1])
    assert _leftovers(tmp_path) == []
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # not mkdtemp's 0700


def test_a_models_tokenizer_with_a_bos_template_and_its_own_eos(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    """Llama-style: encode() would add <s>; the config names </s> the end of a document."""
    tok = Tokenizer.from_file(str(tokenizer))
    tok.add_special_tokens(["<s>", "</s>"])  # ids 700, 701
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", VOCAB)])
    model = tmp_path / "model"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": None}))
    s = pp.preprocess(corpus[0], model, MSL, tmp_path / "out", num_processes=1)
    assert (s.eos_id, s.pad_id, s.vocab_size) == (VOCAB + 1, VOCAB + 1, VOCAB + 2)
    tok.encode_special_tokens = True
    expected = [i for d in corpus[1] for i in [*tok.encode(d, add_special_tokens=False).ids, VOCAB + 1]]
    np.testing.assert_array_equal(_stream_of(_read(tmp_path / "out")), expected)  # no <s> anywhere


def test_the_gpt_hdf5_processor_reads_the_output(
    corpus: tuple[Path, list[str], list[str]], tokenizer: Path, tmp_path: Path
) -> None:
    hdf5 = pytest.importorskip("weightstream.data.hdf5", reason="the GptHDF5MapDataProcessor reader")
    from weightstream.params.schema import InputParams

    out = pp.preprocess(corpus[0], tokenizer, MSL, tmp_path / "out", num_processes=1, samples_per_file=64)
    data = _read(out.output_dir)  # [n, 3, T]
    inp = InputParams(
        data_processor="GptHDF5MapDataProcessor",
        data_dir=str(out.output_dir),
        batch_size=4,
        max_sequence_length=MSL,
        shuffle=False,
    )
    reader = hdf5.GptHDF5MapDataProcessor(inp, VOCAB, 0)
    assert reader.num_samples == len(data)
    rows = np.array([0, 63, 64, len(data) - 1])  # across a file boundary, and the padded last sample
    inputs, targets = reader.samples(rows)
    np.testing.assert_array_equal(inputs, data[rows, 0])
    np.testing.assert_array_equal(targets, np.where(data[rows, 1] == 1, data[rows, 2], -1))

"""Tokenizers: train a byte-level BPE on a corpus (``weightstream tokenizer-train``), and load any Hugging
Face ``tokenizer.json`` with the token that ends a document (``weightstream data-preprocess``).

The trained tokenizer is GPT-2's kind: bytes mapped to 256 printable symbols (so any text encodes, nothing
is ever unknown), GPT-2's pre-tokenizing regex, merges learned from the corpus, and one special token,
``<|endoftext|>``, that preprocessing appends after every document. It is saved as one ``tokenizer.json``
that ``tokenizers.Tokenizer.from_file`` and ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)``
load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from weightstream.data.documents import (
    SUPPORTED_SUFFIXES,
    DataPreprocessError,
    find_input_files,
    read_documents,
)
from weightstream.storage_io import write_text_durably

__all__ = [
    "EOS_CANDIDATES",
    "EOS_TOKEN",
    "MIN_VOCAB_SIZE",
    "LoadedTokenizer",
    "TrainedTokenizer",
    "load_tokenizer",
    "train_tokenizer",
]

EOS_TOKEN = "<|endoftext|>"
# what ends a document in common tokenizers, tried in this order when nothing names it: GPT-2/NeoX/ours,
# Llama 1-2/T5/Mistral, Gemma, Llama 3
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
MIN_VOCAB_SIZE = 257  # the 256 byte symbols and <|endoftext|>
MAX_VOCAB_SIZE = 2**31 - 1  # ids are written as int32


@dataclass(frozen=True)
class TrainedTokenizer:
    path: Path
    vocab_size: int  # may be below the size asked for when the corpus has too few distinct pairs to merge
    eos_id: int
    files: int
    documents: int


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    path: Path
    eos_token: str
    eos_id: int
    pad_token: str
    pad_id: int
    vocab_size: int  # one past the largest id the tokenizer can produce


def _corpus_files(inputs: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            files += find_input_files(p)[0]
        elif not p.is_file():
            raise DataPreprocessError("no such file or directory", p)
        elif not p.name.lower().endswith(SUPPORTED_SUFFIXES):
            raise DataPreprocessError(f"not a corpus file ({', '.join(SUPPORTED_SUFFIXES)})", p)
        else:
            files.append(p)
    return files


def _write_tokenizer(path: Path, text: str) -> None:
    """Written aside, fsynced and renamed into place (a reader never sees half a tokenizer), with the
    permissions of any file the user writes (0o666 less the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(path, text, mode=0o666)


def train_tokenizer(
    inputs: list[Path],
    vocab_size: int,
    output: Path,
    *,
    jsonl_key: str = "text",
    min_frequency: int = 2,
    show_progress: bool = False,
) -> TrainedTokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` tokens (``<|endoftext|>`` included) on the corpus
    files in ``inputs`` (directories are searched for ``.txt``/``.jsonl``/``.jsonl.gz``) and save it as
    ``output`` (a ``tokenizer.json``; a directory gets one inside). Documents stream through the trainer,
    which holds only its word counts."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise DataPreprocessError(
            f"vocab_size {vocab_size}: expected at least {MIN_VOCAB_SIZE} (256 byte symbols and {EOS_TOKEN})"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise DataPreprocessError(f"vocab_size {vocab_size}: expected at most {MAX_VOCAB_SIZE} (int32 ids)")
    files = _corpus_files(inputs)
    if output.is_dir():
        output = output / "tokenizer.json"
    tokenizer = Tokenizer(models.BPE())
    # GPT-2's choices: no space added before the text (so decode(encode(s)) == s), offsets kept untrimmed
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],  # first, so its id is 0 whatever the corpus
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen in the corpus or not
        show_progress=show_progress,
    )
    documents = 0

    def texts() -> Iterator[str]:
        nonlocal documents
        for doc in read_documents(files, jsonl_key):
            documents += 1
            yield doc.text

    tokenizer.train_from_iterator(texts(), trainer)
    if documents == 0:
        raise DataPreprocessError(f"no documents: the {len(files)} corpus files hold no text")
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    assert eos_id is not None
    _write_tokenizer(output, tokenizer.to_str(pretty=True))
    return TrainedTokenizer(output, tokenizer.get_vocab_size(), eos_id, len(files), documents)


def _config_token(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):  # {"content": "</s>", "lstrip": false, ...} in older files
        value = value.get("content")
    return value if isinstance(value, str) else None


def _token_id(tokenizer: Tokenizer, token: str, path: Path, why: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise DataPreprocessError(f"{why} {token!r} is not in the tokenizer's vocabulary", path)
    return token_id


def load_tokenizer(path: Path, eos_token: str | None = None, pad_token: str | None = None) -> LoadedTokenizer:
    """Load a ``tokenizer.json`` (or the one in directory ``path``) and find its end-of-document token:
    ``eos_token`` if given, else the ``eos_token`` of a ``tokenizer_config.json`` beside it (as a Hugging
    Face model directory has), else the first of :data:`EOS_CANDIDATES` in its vocabulary. Padding is
    ``pad_token``, else the config's ``pad_token`` if the vocabulary has it, else the end-of-document
    token (ModelZoo's choice when a tokenizer has no padding token)."""
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DataPreprocessError("no such tokenizer file", path)
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises plain Exception for a bad file
        raise DataPreprocessError(f"not a Hugging Face tokenizer.json: {e}", path) from None
    config: dict[str, Any] = {}
    config_path = path.parent / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataPreprocessError(f"not JSON: {e}", config_path) from None
    if eos_token is not None:
        eos = eos_token
        eos_id = _token_id(tokenizer, eos, path, "the end-of-document token")
    elif (named := _config_token(config, "eos_token")) is not None:
        eos = named
        eos_id = _token_id(tokenizer, eos, path, f"the eos_token of {config_path}")
    else:
        found = [(t, i) for t in EOS_CANDIDATES if (i := tokenizer.token_to_id(t)) is not None]
        if not found:
            raise DataPreprocessError(
                f"no end-of-document token: none of {', '.join(EOS_CANDIDATES)} is in its vocabulary; "
                "name it as eos_token in a tokenizer_config.json beside the file",
                path,
            )
        eos, eos_id = found[0]
    pad, pad_id = eos, eos_id
    if pad_token is not None:
        pad, pad_id = pad_token, _token_id(tokenizer, pad_token, path, "the padding token")
    elif (named := _config_token(config, "pad_token")) is not None:
        named_id = tokenizer.token_to_id(named)
        if named_id is not None:  # a config's pad token missing from the vocabulary: fall back to eos
            pad, pad_id = named, named_id
    vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
    return LoadedTokenizer(tokenizer, path, eos, eos_id, pad, pad_id, vocab_size)

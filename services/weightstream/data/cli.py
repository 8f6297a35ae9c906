"""``weightstream tokenizer-train`` and ``weightstream data-preprocess``: a text corpus into a tokenizer and
into ModelZoo-layout HDF5 samples (registered in ``weightstream.cli``). Options are spelled with
underscores, as ModelZoo's ``cszoo data_preprocess`` spells them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from weightstream.data.base import DataError

__all__ = ["data_preprocess", "tokenizer_train"]

err = Console(stderr=True)
out = Console()

InputDir = Annotated[
    Path,
    typer.Option(
        "--input", help="corpus directory: .txt (a document each), .jsonl, .jsonl.gz", show_default=False
    ),
]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code)


def tokenizer_train(
    input_dir: InputDir,
    vocab_size: Annotated[
        int,
        typer.Option(
            "--vocab_size", help="tokens in the vocabulary, <|endoftext|> included", show_default=False
        ),
    ],
    output: Annotated[
        Path,
        typer.Option("--output", help="the tokenizer.json to write (replaced if there)", show_default=False),
    ],
) -> None:
    """Train a byte-level BPE tokenizer (GPT-2's kind, with <|endoftext|>) on a corpus; saves one
    tokenizer.json that tokenizers and transformers load."""
    from weightstream.data.tokenizer import train_tokenizer  # keeps `--help` fast

    try:
        with err.status(f"training a {vocab_size:,}-token tokenizer on {input_dir}"):
            result = train_tokenizer([input_dir], vocab_size, output)
    except DataError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(str(e), 1) from None
    short = (
        f" (the corpus has too few repeated pairs for {vocab_size:,})"
        if result.vocab_size < vocab_size
        else ""
    )
    out.print(
        f"tokenizer {result.path}: {result.vocab_size:,} tokens{short}, <|endoftext|> = {result.eos_id}, "
        f"trained on {_count(result.documents, 'document')} in {_count(result.files, 'file')}",
        highlight=False,
        soft_wrap=True,
    )


def data_preprocess(
    input_dir: InputDir,
    tokenizer: Annotated[
        Path,
        typer.Option(
            "--tokenizer", help="a tokenizer.json (ours or a Hugging Face model's)", show_default=False
        ),
    ],
    max_sequence_length: Annotated[
        int, typer.Option("--max_sequence_length", help="tokens per sample", show_default=False)
    ],
    output: Annotated[
        Path,
        typer.Option("--output", help="directory for data-*.h5 and data_params.json", show_default=False),
    ],
    jsonl_key: Annotated[str, typer.Option("--jsonl_key", help="the text's key in .jsonl records")] = "text",
    num_processes: Annotated[
        int | None,
        typer.Option(
            "--num_processes", help="tokenizer processes (default: the cores available)", show_default=False
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace an output directory of an earlier run")
    ] = False,
) -> None:
    """Tokenize a corpus and pack it into samples of max_sequence_length tokens in ModelZoo's GPT HDF5
    layout (dataset 'data' of n x 3 x max_sequence_length: input_ids, attention_mask, labels), for
    GptHDF5MapDataProcessor. The output directory appears only when complete."""
    from weightstream.data.preprocess import PreprocessProgress, preprocess  # keeps `--help` fast

    bar = preprocess_progress(err)
    task = bar.add_task("preprocessing", total=None, documents=0, tokens=0)

    def progress(p: PreprocessProgress) -> None:
        bar.update(task, completed=p.files_done, total=p.files_total, documents=p.documents, tokens=p.tokens)

    try:
        with bar:
            s = preprocess(
                input_dir,
                tokenizer,
                max_sequence_length,
                output,
                jsonl_key=jsonl_key,
                num_processes=num_processes,
                overwrite=overwrite,
                progress=progress,
            )
    except DataError as e:
        raise _fail(str(e)) from None
    except (OSError, RuntimeError) as e:
        raise _fail(str(e), 1) from None
    ignored = f"; ignored {_count(s.ignored_files, 'file')} of other kinds" if s.ignored_files else ""
    out.print(
        f"{s.output_dir}: {_count(s.samples, 'sample')} of {s.max_sequence_length:,} tokens in "
        f"{_count(len(s.files), 'file')}, from {_count(s.documents, 'document')} in "
        f"{_count(s.input_files, 'file')} ({s.tokens:,} tokens, {s.tokens / max(s.seconds, 1e-9):,.0f} "
        f"tokens/s); vocab_size {s.vocab_size:,}, eos_id {s.eos_id}, pad_id {s.pad_id}{ignored}",
        highlight=False,
        soft_wrap=True,
    )


def preprocess_progress(console: Console) -> Progress:
    """The preprocessing bar: files done of all, documents and tokens so far, elapsed time. Redrawn twice a
    second, as the training bars are, not rich's ten: the redraws' CPU (15 ms a second in a terminal here)
    would be taken from the tokenizer processes on a small machine."""
    return Progress(
        TextColumn("preprocessing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files, {task.fields[documents]:,} documents, {task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=2,
    )

"""``weightstream plot``: the loss curves of one or several runs from their ``metrics.jsonl``, as a PNG.

matplotlib is an optional extra (``weightstream[plot]``), imported only here, only when drawing: the
command line loads this module for every command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["Curves", "plot", "read_curves"]

PLOT_HINT = 'pip install "weightstream[plot]"'  # as `weightstream simulate --plot` says it

Curve = dict[int, float]  # step (1-based, updates applied) -> loss
err = Console(stderr=True)


@dataclass(frozen=True)
class Curves:
    """One run's training loss and eval loss by step."""

    model_dir: Path
    train: Curve
    evals: Curve


def read_curves(model_dir: Path) -> Curves:
    """The curves in ``model_dir/metrics.jsonl``. A step logged twice (as earlier weightstream versions
    wrote when a run restarted from step 0 in a used model_dir) keeps its last value; a torn last line (a
    crash mid-write) is skipped. Raises ValueError naming the directory, or the file and line."""
    path = model_dir / "metrics.jsonl"
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir}: no such directory")
    if not path.is_file():
        raise ValueError(f"{model_dir} has no metrics.jsonl: not a model_dir that `weightstream run` wrote")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    train: Curve = {}
    evals: Curve = {}
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError) as e:
            if n == len(lines) and not line.endswith("\n"):
                continue  # torn by a crash, as trim_metrics treats it
            raise ValueError(f"{path}:{n}: not a metrics record ({e}): {line.strip()[:80]!r}") from e
        if "loss" in record:
            train[step] = float(record["loss"])
        if "eval_loss" in record:
            evals[step] = float(record["eval_loss"])
    if not train and not evals:
        raise ValueError(f"{path} has no loss logged yet")
    return Curves(model_dir, train, evals)


def _draw(runs: list[Curves], output: Path, title: str | None) -> None:
    """Training loss (lines) above eval loss (lines with markers), one colour per run."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, run in enumerate(runs):
        colour, label = f"C{i % 10}", str(run.model_dir)
        if run.train:
            steps = sorted(run.train)
            top.plot(steps, [run.train[s] for s in steps], color=colour, label=label)
        if run.evals:
            steps = sorted(run.evals)
            bottom.plot(steps, [run.evals[s] for s in steps], color=colour, marker="o", label=label)
    top.set_ylabel("training loss")
    bottom.set_ylabel("eval loss")
    bottom.set_xlabel("step")
    if not any(run.evals for run in runs):
        bottom.text(0.5, 0.5, "no evaluation logged", ha="center", va="center", transform=bottom.transAxes)
    top.legend(fontsize=8)
    if title:
        top.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def plot(
    model_dirs: Annotated[
        list[Path], typer.Argument(help="model_dirs of runs, each with its metrics.jsonl", show_default=False)
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="the PNG to write")] = Path("curves.png"),
    title: Annotated[str | None, typer.Option(help="a title above the curves")] = None,
) -> None:
    """Draw training and eval loss against step for one or several runs into a PNG."""
    try:
        runs = [read_curves(d) for d in model_dirs]
    except ValueError as e:
        raise _fail(str(e)) from None
    if not output.parent.is_dir():
        raise _fail(f"--output {output}: no directory {output.parent} to write it in")
    try:
        import matplotlib  # noqa: F401  (only to say which extra is missing; _draw uses it)
    except ImportError:
        raise _fail(f"plot needs matplotlib, an optional extra: {PLOT_HINT}") from None
    _draw(runs, output, title)
    typer.echo(f"plot: {output}")


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(2)

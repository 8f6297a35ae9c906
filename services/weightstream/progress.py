"""The step progress bar both trainers show: step n/N, a bar, a status text, elapsed time and ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["step_progress"]


def step_progress(console: Console) -> Progress:
    """A transient bar (it disappears when done, leaving the logged lines); set ``status`` per task."""
    return Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )

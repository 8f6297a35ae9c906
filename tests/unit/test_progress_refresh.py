"""The progress bars redraw twice a second, not rich's default ten (console.py's ``step_progress``, the
client's ``ProgressBar``, ``weightstream data-preprocess``'s bar): a redraw costs CPU in a terminal (15 ms a
second at ten here), taken from the workers' compute (or the tokenizers) on the same small machine."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from weightstream.console import step_progress
from weightstream.data.cli import preprocess_progress
from weightstream_client._progress import ProgressBar


def _rate(progress: Progress) -> float:
    """How often ``progress`` redraws by itself, per second: rich's refresh thread waits 1 / this between
    redraws (``rich.live._RefreshThread``), so the figure is the rate; nothing is timed."""
    return progress.live.refresh_per_second


def test_the_training_bar_redraws_twice_a_second() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with step_progress(console) as progress:
        assert progress.live.auto_refresh and _rate(progress) == 2


def test_the_clients_follow_bar_redraws_twice_a_second() -> None:
    bar = ProgressBar("job1")
    try:
        assert bar.p.live.auto_refresh and _rate(bar.p) == 2
    finally:
        bar.close()


def test_the_preprocessing_bar_redraws_twice_a_second() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with preprocess_progress(console) as progress:
        assert progress.live.auto_refresh and _rate(progress) == 2

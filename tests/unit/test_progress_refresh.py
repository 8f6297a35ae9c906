"""The progress bars redraw twice a second, not rich's default ten (console.py's ``step_progress``, the
client's ``ProgressBar``, ``weightstream data-preprocess``'s bar): a redraw costs CPU in a terminal (15 ms a
second at ten here), taken from the workers' compute (or the tokenizers) on the same small machine."""

from __future__ import annotations

import io
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress

from weightstream.console import step_progress
from weightstream.data.cli import preprocess_progress
from weightstream_client._progress import ProgressBar


def _redraws(progress: Progress, seconds: float) -> int:
    """How often ``progress`` (started) redraws by itself in ``seconds``."""
    count = [0]
    live = progress.live
    original = live.refresh

    def counted(*args: Any, **kw: Any) -> None:
        count[0] += 1
        original(*args, **kw)

    live.refresh = counted  # type: ignore[method-assign]  # the refresh thread calls it through the instance
    time.sleep(seconds)
    return count[0]


def test_the_training_bar_redraws_twice_a_second() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with step_progress(console) as progress:
        progress.add_task("train", total=10, status="")
        n = _redraws(progress, 1.5)
    assert 1 <= n <= 5  # ten a second would be ~15 (a busy machine only draws fewer)


def test_the_clients_follow_bar_redraws_twice_a_second() -> None:
    bar = ProgressBar("job1")
    try:
        n = _redraws(bar.p, 1.5)
    finally:
        bar.close()
    assert 1 <= n <= 5


def test_the_preprocessing_bar_redraws_twice_a_second() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with preprocess_progress(console) as progress:
        progress.add_task("preprocessing", total=10, documents=0, tokens=0)
        n = _redraws(progress, 1.5)
    assert 1 <= n <= 5

"""The files a run's records leave the process in: ``metrics.jsonl`` and ModelZoo's TensorBoard files.

A line of ``metrics.jsonl`` is a record's ``to_dict()`` (``training.records``) as JSON, written and flushed
when the step or evaluation is logged, so that a running job's metrics can be read at once; the TensorBoard
scalars are the same values (``tensorboard.RunEvents``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from weightstream.training.records import EvalRecord, StepMetrics, StepRecord
from weightstream.training.tensorboard import RunEvents

__all__ = ["MetricsWriter"]


class MetricsWriter:
    """Appends to ``model_dir/metrics.jsonl`` and writes ``model_dir/train`` and ``eval`` (see
    ``RunEvents`` for ``start_step``, ``batch_size``, ``with_eval`` and ``clock``). A context manager."""

    def __init__(
        self,
        model_dir: Path,
        start_step: int,
        batch_size: int,
        with_eval: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file = (model_dir / "metrics.jsonl").open("a", encoding="utf-8")
        try:
            self._events = RunEvents(model_dir, start_step, batch_size, with_eval, clock)
        except BaseException:
            self._file.close()
            raise

    def step(self, record: StepRecord, tokens_per_second: float) -> StepMetrics:
        """Log step ``record.step`` with the run's throughput (and its sample rates, measured now):
        returns the line written. Call it once per logged step, in order."""
        line = StepMetrics(record, tokens_per_second, self._events.rates(record.step))
        self._write(line.to_dict())
        self._events.log_step(line)
        return line

    def eval(self, record: EvalRecord) -> None:
        """Log an evaluation."""
        self._write(record.to_dict())
        self._events.log_eval(record.step, record.eval_loss)

    def _write(self, line: dict[str, object]) -> None:
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

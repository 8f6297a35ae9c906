"""TensorBoard event files of a run, in ModelZoo's layout: ``model_dir/train`` and ``model_dir/eval``.

The scalar names and their meaning follow Cerebras ModelZoo, so dashboards and scripts written for its
runs read ours unchanged (github.com/Cerebras/modelzoo):
  - ``src/cerebras/modelzoo/common/run_cstorch_flow.py``, ``run_cstorch_train``: the summary dir is
    ``model_dir/train``; at each log step ``loss``, ``local_samples_per_sec`` (the rate tracker's
    ``rate``), ``avg_samples_per_sec`` (its ``global_rate``) and ``avg_steps_per_sec`` (``global_rate /
    batch_size``); ``run_cstorch_eval`` writes the mean eval ``loss`` into ``model_dir/eval``.
  - ``src/cerebras/modelzoo/trainer/callbacks/profiler.py``, ``RateProfiler``: ``rate`` is the samples
    since it was last queried over the time since, ``global_rate`` the samples since the run began over
    the time since; samples, not tokens.
ModelZoo logs the learning rate as ``lr/<group>``; we have one group, so ``lr``. ``grad_norm`` is the
global gradient norm before clipping, as in ``metrics.jsonl``.

Every value here is the one of the same step's ``metrics.jsonl`` record (TensorBoard keeps float32).

Written with TensorBoard's own record writer and event protos (``tensorboard.summary.writer``, no torch, no
TensorFlow), synchronously: each step's events are in the file, fsynced, when ``log_step`` returns, so a
running job's curves update live and survive a crash. A file starts with its version event and
``SessionLog.START`` at the purge step, as ``SummaryWriter(purge_step=...)`` writes it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from weightstream.training.records import SampleRates, StepMetrics

__all__ = ["TRAIN_SCALARS", "RunEvents"]

# record field (metrics.jsonl) -> scalar name (TensorBoard), for every logged training step: the names
# ``RunEvents.log_step`` writes, besides ``avg_steps_per_sec``
TRAIN_SCALARS = {
    "loss": "loss",
    "learning_rate": "lr",
    "grad_norm": "grad_norm",
    "local_samples_per_sec": "local_samples_per_sec",
    "avg_samples_per_sec": "avg_samples_per_sec",
}


class _EventFile:
    """One event file in ``log_dir``, each write on disk when ``flush`` returns."""

    def __init__(self, log_dir: Path, purge_step: int, suffix: str) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        # TensorBoard reads files whose names hold "tfevents", in name order; ours are unique per writer
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        self.file = open(log_dir / name, "xb")  # noqa: SIM115 (closed in close())
        self.records = RecordWriter(self.file)  # TFRecord framing: length, masked CRC-32C, data, CRC
        self.closed = False
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        # TensorBoard drops every event at a step >= purge_step from the files read before this one
        self._write(
            event_pb2.Event(
                wall_time=time.time(),
                step=purge_step,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
            )
        )
        self.flush()

    def _write(self, event: event_pb2.Event) -> None:
        self.records.write(event.SerializeToString())

    def scalar(self, tag: str, value: float, step: int) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        self._write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))  # float32

    def flush(self) -> None:
        self.records.flush()
        os.fsync(self.file.fileno())  # the curves survive a crash of the coordinator's host

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.flush()
            self.records.close()


class RunEvents:
    """The event files one run writes: ``train/`` at each logged step, ``eval/`` at each evaluation.

    ``start_step``: the step the run starts from (its checkpoint's, 0 for a fresh run). TensorBoard
    drops every event at a step past it from the directory's earlier files (``purge_step``), as
    ``trim_metrics`` drops those records from ``metrics.jsonl``: the steps after the checkpoint that an
    earlier attempt logged are run and logged again, and show once. ``batch_size``: samples per step
    (the global batch). ``with_eval``: the run evaluates (``eval/`` is also written where an earlier
    run left one, to purge it). ``clock``: seconds, monotonic; the rates are measured from this call on.
    """

    def __init__(
        self,
        model_dir: Path,
        start_step: int,
        batch_size: int,
        with_eval: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.start_step, self.batch_size, self.clock = start_step, batch_size, clock
        self.t0 = self.t_logged = clock()
        self.step_logged = start_step
        # A name unique to this writer: a restart within the same second must not reuse the earlier
        # attempt's file. Nanoseconds since the epoch, all 19 digits, also sort the files of one second by
        # start time, the order in which TensorBoard reads (and purges) them.
        suffix = f".{time.time_ns()}"
        purge = start_step + 1  # events at steps > start_step are dropped, as trim_metrics keeps <=
        self.train = _EventFile(model_dir / "train", purge, suffix)
        # eval/ even before the first evaluation of a resumed run: its purge hides the earlier attempt's
        # evaluations past the checkpoint at once, as trim_metrics does
        self.eval: _EventFile | None = None
        if with_eval or (model_dir / "eval").is_dir():
            try:
                self.eval = _EventFile(model_dir / "eval", purge, suffix)
            except BaseException:
                self.train.close()
                raise

    def rates(self, step: int) -> SampleRates:
        """Samples per second at logged step ``step`` (1-based): ``local_samples_per_sec`` over the
        steps since the previous logged step (or the run's start), ``avg_samples_per_sec`` over every
        step of this run. Call it once per logged step, in order."""
        now = self.clock()
        local = (step - self.step_logged) * self.batch_size / max(now - self.t_logged, 1e-9)
        avg = (step - self.start_step) * self.batch_size / max(now - self.t0, 1e-9)
        self.step_logged, self.t_logged = step, now
        return SampleRates(local_samples_per_sec=local, avg_samples_per_sec=avg)

    def log_step(self, line: StepMetrics) -> None:
        """Write a logged step's ``metrics.jsonl`` line (with its ``rates``) and flush, so that a running
        job's curves update live."""
        record, rates = line.record, line.rates
        scalars = (  # in TRAIN_SCALARS's order, then ModelZoo's steps per second
            ("loss", record.loss),
            ("lr", record.learning_rate),
            ("grad_norm", record.grad_norm),
            ("local_samples_per_sec", rates.local_samples_per_sec),
            ("avg_samples_per_sec", rates.avg_samples_per_sec),
            ("avg_steps_per_sec", rates.avg_samples_per_sec / self.batch_size),
        )
        for tag, value in scalars:
            self.train.scalar(tag, value, record.step)
        self.train.flush()

    def log_eval(self, step: int, eval_loss: float) -> None:
        """The mean eval loss after step ``step``, as ``loss`` in ``eval/``."""
        if self.eval is None:  # a run whose params have no eval_input does not evaluate
            raise RuntimeError("RunEvents was made with_eval=False, yet an evaluation was logged")
        self.eval.scalar("loss", eval_loss, step)
        self.eval.flush()

    def close(self) -> None:
        """Flush and close both files (closing again does nothing)."""
        for w in (self.train, self.eval):
            if w is not None:
                w.close()

    def __enter__(self) -> RunEvents:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

"""What a run measures of its steps and evaluations, typed from the step driver to ``metrics.jsonl``.

``training.stepping`` makes a ``StepRecord`` of each step it drives; the runner adds the run's throughput
(``StepMetrics``, with ``tensorboard.RunEvents.rates`` at a logged step) and writes ``metrics.jsonl`` and
the TensorBoard files from it. Everything in between reads attributes; a record becomes JSON only where it
leaves the process, through ``to_dict``, whose keys and their order are the file's format:

  a logged step:   step, loss, learning_rate, grad_norm, step_time_s, worker_wait_s, worker_compute_s,
                   update_s, worker_peak_rss_bytes, worker_wire_bytes, workers, slowest_worker,
                   slowest_worker_ratio, slowest_worker_lag_s, tokens_per_second, local_samples_per_sec,
                   avg_samples_per_sec
  an evaluation:   step, eval_loss

The events a job emits (``training.events``) carry the same records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EvalRecord", "SampleRates", "StepMetrics", "StepRecord"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step as the step driver measured it. Times in seconds, sizes in bytes.

    A step committed after a fault during its update (the update had landed on every shard) keeps the
    zero ``step_time_s`` and ``update_s`` it had before the update was sent."""

    step: int  # 1-based: updates applied once this step is done
    loss: float  # summed over the workers
    learning_rate: float
    grad_norm: float  # global norm before clipping
    tokens: int  # counted target tokens of the global batch: the run's throughput, not a field of the file
    step_time_s: float  # from the step's start (or the previous commit, when sent ahead) to its update's end
    worker_wait_s: float  # the slowest worker's wait for weights
    worker_compute_s: float  # the slowest worker's compute
    update_s: float  # from the workers' replies to the update's end: the norm and the optimizer
    worker_peak_rss_bytes: int  # the largest worker's peak resident memory
    worker_wire_bytes: int  # weights in and gradients out over every worker's link: falls with density
    # the workers whose shards of the global batch made the step: runconfig.num_csx, fewer while the job
    # goes on without workers it could not replace (runconfig.min_num_csx)
    workers: int = 1
    # the worker the step waited for (-1: fewer than two workers), its time over the others' median and
    # how many seconds behind it was (``training.stragglers``): a slow host or link shows here step by step
    slowest_worker: int = -1
    slowest_worker_ratio: float = 1.0
    slowest_worker_lag_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The step's fields of its ``metrics.jsonl`` line and its ``step`` event, in the file's order
        (``tokens`` is not one of them)."""
        return {
            "step": self.step,
            "loss": self.loss,
            "learning_rate": self.learning_rate,
            "grad_norm": self.grad_norm,
            "step_time_s": self.step_time_s,
            "worker_wait_s": self.worker_wait_s,
            "worker_compute_s": self.worker_compute_s,
            "update_s": self.update_s,
            "worker_peak_rss_bytes": self.worker_peak_rss_bytes,
            "worker_wire_bytes": self.worker_wire_bytes,
            "workers": self.workers,
            "slowest_worker": self.slowest_worker,
            "slowest_worker_ratio": self.slowest_worker_ratio,
            "slowest_worker_lag_s": self.slowest_worker_lag_s,
        }


@dataclass(frozen=True, slots=True)
class SampleRates:
    """ModelZoo's samples per second at a logged step (``tensorboard.RunEvents.rates``)."""

    local_samples_per_sec: float  # over the steps since the previous logged step
    avg_samples_per_sec: float  # over every step of this run


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """A logged step's line of ``metrics.jsonl``: its record, the run's throughput and sample rates."""

    record: StepRecord
    tokens_per_second: float  # tokens committed by this run over the time since its first step began
    rates: SampleRates

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.record.to_dict(),
            "tokens_per_second": self.tokens_per_second,
            "local_samples_per_sec": self.rates.local_samples_per_sec,
            "avg_samples_per_sec": self.rates.avg_samples_per_sec,
        }


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """An evaluation's line of ``metrics.jsonl``: the mean eval loss after step ``step`` (1-based)."""

    step: int
    eval_loss: float

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "eval_loss": self.eval_loss}

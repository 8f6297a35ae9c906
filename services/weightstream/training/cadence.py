"""When a run logs, evaluates and checkpoints: one rule for the appliance and ``train-reference``.

"Log every ``log_steps``, evaluate every ``eval_frequency``, checkpoint every ``checkpoint_steps``, and all
three after the last step." Steps are counted as updates applied (1-based), as in ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightstream.params import Params

__all__ = ["Cadence"]


@dataclass(frozen=True)
class Cadence:
    max_steps: int
    log_steps: int
    eval_frequency: int  # 0: only at the end
    checkpoint_steps: int  # 0: only at the end
    has_eval: bool  # the params have an eval_input section

    @classmethod
    def of(cls, params: Params) -> Cadence:
        rc = params.runconfig
        return cls(
            rc.max_steps, rc.log_steps, rc.eval_frequency, rc.checkpoint_steps, params.eval_input is not None
        )

    def last(self, done: int) -> bool:
        return done == self.max_steps

    def log(self, done: int) -> bool:
        return done % self.log_steps == 0 or self.last(done)

    def evaluate(self, done: int) -> bool:
        every = bool(self.eval_frequency) and done % self.eval_frequency == 0
        return self.has_eval and (every or self.last(done))

    def checkpoint(self, done: int) -> bool:
        every = bool(self.checkpoint_steps) and done % self.checkpoint_steps == 0
        return every or self.last(done)

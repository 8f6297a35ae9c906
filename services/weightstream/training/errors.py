"""How a job ends other than by finishing: failed (with what happened), diverged (a kind of failure), or
cancelled. Raised by the runner and the reference trainer; the service and the console turn them into a
job's state and an exit code."""

from __future__ import annotations

__all__ = ["JobCancelled", "JobFailed", "RoleFault", "TrainingDiverged"]


class JobFailed(RuntimeError):
    """The job cannot go on; the message names the role and what happened."""


class JobCancelled(RuntimeError):
    """The job was cancelled; every role was stopped, checkpoints written so far are intact."""


class TrainingDiverged(JobFailed):
    """The loss or the gradient norm of a step is NaN or infinite."""


class RoleFault(JobFailed):
    """A call to a role failed, timed out, or a role died while a step, an evaluation or a checkpoint
    was in progress. The runner recovers from it (``training.recovery``); it fails the job only where
    recovery is not possible."""

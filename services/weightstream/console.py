"""The terminal front-end of ``weightstream run`` and ``train-reference``: progress bars and log lines.

``cli.py`` parses the command line and loads params; this module runs the training and shows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from weightstream.backends.base import Backend
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import Params
from weightstream.training.cadence import Cadence
from weightstream.training.events import (
    CheckpointEvent,
    EvalEvent,
    JobEvent,
    RecoveredEvent,
    RestartEvent,
    ResumingEvent,
    RetryEvent,
    StartingEvent,
    StartingFromEvent,
    StepEvent,
    StragglerEvent,
    WorkersEvent,
)
from weightstream.training.runner import JobFailed, JobRunner, job_log

__all__ = ["interrupted_message", "run_job", "step_progress", "train_reference"]


REFRESH_PER_SECOND = 2.0


def step_progress(console: Console) -> Progress:
    """The bar both trainers show: step n/N, a bar, a status text, elapsed time and ETA. Transient: it
    disappears when done, leaving the logged lines. Set ``status`` per task."""
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
        # rich redraws 10 times a second by default: 15 ms of CPU a second in a terminal here, taken from the
        # workers' compute on a small machine; steps take a second or more, so twice a second shows them
        refresh_per_second=REFRESH_PER_SECOND,
    )


def _step_line(
    step: int, loss: float, learning_rate: float, grad_norm: float, tokens_per_second: float
) -> str:
    return (
        f"step {step:>6}  loss {loss:.4f}  lr {learning_rate:.3g}  "
        f"|g| {grad_norm:.3f}  {tokens_per_second:,.0f} tok/s"
    )


@dataclass
class _Committed:
    step: int = 0  # the last step committed
    checkpoint: int | None = None  # the step of the newest checkpoint, None while there is none


def run_job(
    params: Params, out: Console, err: Console, make_backend: Callable[[Path], Backend] | None = None
) -> int:
    """Run the job whose params ``jobs.admission.admit`` has passed (its data, its size, its
    checkpoint) on the backend ``make_backend(model_dir / "logs")`` gives (default: local processes);
    returns the process exit code (0 done, 1 failed, 130 interrupted)."""
    rc, cadence = params.runconfig, Cadence.of(params)
    model_dir = Path(rc.model_dir)
    at = _Committed()  # what Ctrl-C would lose: the steps committed since the newest checkpoint
    backend = (make_backend or LocalProcessBackend)(model_dir / "logs")
    where = "as local processes" if isinstance(backend, LocalProcessBackend) else "as Slurm job steps"
    progress = step_progress(out)
    task = progress.add_task("train", total=rc.max_steps, status="starting roles")

    def on_event(e: JobEvent) -> None:
        match e:
            case StartingEvent():
                roles = ", ".join(f"{n} {k}" for k, n in e.roles.items())
                progress.console.print(f"starting {roles} {where} (logs in {model_dir / 'logs'})")
            case StartingFromEvent():
                progress.console.print(f"starting from the weights of {e.checkpoint}")
            case ResumingEvent():
                progress.console.print(f"resuming from {e.checkpoint} (step {e.step})")
                progress.update(task, completed=e.step)
                at.step = at.checkpoint = e.step
            case StepEvent(record=r):
                at.step = r.step
                progress.update(
                    task, completed=r.step, status=f"loss {r.loss:.4f}  {e.tokens_per_second:,.0f} tok/s"
                )
                if cadence.log(r.step):
                    line = _step_line(r.step, r.loss, r.learning_rate, r.grad_norm, e.tokens_per_second)
                    fewer = f"  {r.workers}/{rc.num_csx} workers" if r.workers < rc.num_csx else ""
                    progress.console.print(f"{line}  {r.step_time_s * 1000:.0f} ms/step{fewer}")
            case EvalEvent():
                progress.console.print(f"step {e.step:>6}  [cyan]eval_loss {e.eval_loss:.4f}[/cyan]")
            case CheckpointEvent():
                progress.console.print(f"step {e.step:>6}  checkpoint {e.path}")
                at.checkpoint = e.step
            case RestartEvent():
                progress.console.print(
                    f"step {e.step:>6}  [yellow]restart {e.restarts}/{e.max_role_restarts}:[/yellow] "
                    f"{escape(e.reason)}{f' (host {escape(e.host)})' if e.host else ''}",
                    soft_wrap=True,
                )
            case RetryEvent():
                progress.console.print(f"step {e.step:>6}  [yellow]retry:[/yellow] {escape(e.reason)}")
            case WorkersEvent():
                progress.console.print(
                    f"step {e.step:>6}  [yellow]workers {e.from_workers} → {e.to_workers}:[/yellow] "
                    f"{escape(e.reason)}",
                    soft_wrap=True,
                )
            case RecoveredEvent():
                replay = f", replaying {e.replay_steps} steps" if e.replay_steps else ""
                action = f": {escape(e.action)}" if e.action else ""
                progress.console.print(
                    f"step {e.step:>6}  recovered in {e.recovery_s:.1f}s{replay}{action}", soft_wrap=True
                )
            case StragglerEvent():
                progress.console.print(
                    f"step {e.step:>6}  [yellow]straggler:[/yellow] {e.worker} on {escape(e.host)} "
                    f"{e.ratio:.1f}x the other workers' median for {e.steps} steps",
                    soft_wrap=True,
                )

    t0 = time.monotonic()
    try:
        with job_log(model_dir, "local") as job_logger, progress:
            try:
                summary = JobRunner(params, backend, on_event, job_id="local").run()
            except JobFailed as e:
                job_logger.error("job failed: %s", e)
                raise
    except JobFailed as e:
        err.print(f"[red]job failed:[/red] {e}", soft_wrap=True, highlight=False)
        return 1
    except KeyboardInterrupt:
        err.print(interrupted_message(params, at.step, at.checkpoint), soft_wrap=True, highlight=False)
        return 130
    if summary.steps_run == 0:
        out.print(
            f"nothing to do: {model_dir} already holds step {summary.start_step} (max_steps {rc.max_steps})"
        )
        return 0
    loss = f", final loss {summary.last_loss:.4f}" if summary.last_loss is not None else ""
    ev = f", eval_loss {summary.last_eval_loss:.4f}" if summary.last_eval_loss is not None else ""
    out.print(
        f"done: steps {summary.start_step}→{summary.final_step} in {time.monotonic() - t0:.1f}s{loss}{ev}; "
        f"checkpoint {summary.checkpoint}"
    )
    return 0


def interrupted_message(params: Params, step: int, checkpoint: int | None) -> str:
    """What Ctrl-C after ``step`` committed steps kept, given the newest checkpoint's step (None: there is
    none), and how to lose less next time."""
    rc = params.runconfig
    how = (
        "set checkpoint_steps (runconfig.checkpoint_steps, or trainer.init.checkpoint.steps) to write "
        "checkpoints more often"
    )
    if checkpoint is None:
        when = f"every {rc.checkpoint_steps} steps" if rc.checkpoint_steps else "only at the end"
        return (
            f"interrupted at step {step}: every role was stopped. No checkpoint was written (checkpoints "
            f"come {when}), so the {step} steps trained are lost; {how}"
        )
    text = (
        f"interrupted at step {step}: every role was stopped. The checkpoint of step {checkpoint} in "
        f"{rc.model_dir} is intact: `weightstream run` again resumes from it"
    )
    lost = step - checkpoint
    if lost:
        text += f"; the {lost} step{'s' if lost != 1 else ''} after it are lost ({how})"
    return text


def train_reference(params: Params, out: Console, metrics: Path | None = None) -> None:
    """Train in this process with every weight resident; log and evaluate on the appliance's cadence.
    Raises DataError (before anything is shown) if the data cannot be read."""
    from weightstream.training.reference import ReferenceTrainer

    rc, cadence = params.runconfig, Cadence.of(params)
    trainer = ReferenceTrainer(params)
    out.print(
        f"training {params.model.name} ({trainer.model.num_params:,} parameters) for {rc.max_steps} steps, "
        f"global batch {params.train_input.batch_size} split over {trainer.num_shards} shard(s)"
    )
    sink = metrics.open("w", encoding="utf-8") if metrics else None
    tokens, t0, loss = 0, time.perf_counter(), float("nan")
    try:
        with step_progress(out) as progress:
            task = progress.add_task("train", total=rc.max_steps, status="")
            for _ in range(rc.max_steps):
                r = trainer.train_step()
                tokens, loss = tokens + r.tokens, r.loss
                tps = tokens / (time.perf_counter() - t0)
                progress.update(task, advance=1, status=f"loss {r.loss:.4f}  {tps:,.0f} tok/s")
                if cadence.log(r.step):
                    progress.console.print(_step_line(r.step, r.loss, r.learning_rate, r.grad_norm, tps))
                    if sink:
                        record = {
                            "step": r.step,
                            "loss": r.loss,
                            "learning_rate": r.learning_rate,
                            "grad_norm": r.grad_norm,
                            "tokens_per_second": tps,
                            "step_time_s": r.step_time_s,
                        }
                        sink.write(json.dumps(record) + "\n")
                if cadence.evaluate(r.step):
                    eval_loss = trainer.evaluate()
                    progress.console.print(f"step {r.step:>6}  [cyan]eval_loss {eval_loss:.4f}[/cyan]")
                    if sink:
                        sink.write(json.dumps({"step": r.step, "eval_loss": eval_loss}) + "\n")
    finally:
        if sink:
            sink.close()
    out.print(f"done: {rc.max_steps} steps in {time.perf_counter() - t0:.1f}s, final loss {loss:.4f}")

"""`weightstream run`: one job on this machine, with a live progress display."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from weightstream.coordinator.backend import LocalProcessBackend
from weightstream.coordinator.runner import JobFailed, JobRunner, job_log
from weightstream.data import DataError, make_data_processor
from weightstream.params import Params
from weightstream.progress import step_progress

__all__ = ["run_local"]


def run_local(params: Params, out: Console, err: Console) -> int:
    """Run the job; returns the process exit code (0 done, 1 failed, 2 bad data, 130 interrupted)."""
    rc = params.runconfig
    try:  # the data is checked here, before any process starts
        make_data_processor(params.train_input, params.model, "train")
        if params.eval_input:
            make_data_processor(params.eval_input, params.model, "eval")
    except DataError as e:
        err.print(f"[red]error:[/red] {e}", soft_wrap=True)
        return 2
    model_dir = Path(rc.model_dir)
    backend = LocalProcessBackend(model_dir / "logs")
    progress = step_progress(out)
    task = progress.add_task("train", total=rc.max_steps, status="starting roles")

    def on_event(e: dict[str, Any]) -> None:
        kind = e["event"]
        if kind == "status" and e["status"] == "starting":
            roles = ", ".join(f"{n} {k}" for k, n in e["roles"].items())
            progress.console.print(f"starting {roles} as local processes (logs in {model_dir / 'logs'})")
        elif kind == "status" and e["status"] == "resuming":
            progress.console.print(f"resuming from {e['checkpoint']} (step {e['step']})")
            progress.update(task, completed=e["step"])
        elif kind == "step":
            progress.update(
                task, completed=e["step"], status=f"loss {e['loss']:.4f}  {e['tokens_per_second']:,.0f} tok/s"
            )
            if e["step"] % rc.log_steps == 0 or e["step"] == rc.max_steps:
                progress.console.print(
                    f"step {e['step']:>6}  loss {e['loss']:.4f}  lr {e['learning_rate']:.3g}  "
                    f"|g| {e['grad_norm']:.3f}  {e['tokens_per_second']:,.0f} tok/s  "
                    f"{e['step_time_s'] * 1000:.0f} ms/step"
                )
        elif kind == "eval":
            progress.console.print(f"step {e['step']:>6}  [cyan]eval_loss {e['eval_loss']:.4f}[/cyan]")
        elif kind == "checkpoint":
            progress.console.print(f"step {e['step']:>6}  checkpoint {e['path']}")

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
        err.print("interrupted: every role was stopped; checkpoints written so far are intact")
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

"""``wsctl``: submit and follow jobs on a weightstream service (WEIGHTSTREAM_URL, WEIGHTSTREAM_TOKEN).

The verbs of Cerebras' csctl are here too (``get jobs``, ``get job``, ``cancel job``, ``label job``,
``job set-priority``, ``log-export``, ``config view``, ``dashboard``): see ``_verbs``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from weightstream_client._client import ApiError, JobFailedError, load_params
from weightstream_client._common import JobId, Url, connect, err, fail, out, parse_labels
from weightstream_client._download import CheckpointExistsError
from weightstream_client._verbs import register

__all__ = ["app", "main"]

app = typer.Typer(
    help="wsctl: submit and follow jobs on a weightstream service (WEIGHTSTREAM_URL, WEIGHTSTREAM_TOKEN).",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def submit(
    params: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="params YAML")],
    num_csx: Annotated[
        int | None,
        typer.Option(
            "--num_csx",
            min=1,
            help="CS-2 workers (overrides runconfig.num_csx; default: what the params say)",
            show_default=False,
        ),
    ] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    priority: Annotated[int, typer.Option(min=1, max=3, help="1 runs first")] = 2,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show progress until the job ends")] = False,
    url: Url = None,
) -> None:
    """Submit a job; prints its id (and follows it with --follow)."""
    client = connect(url)
    try:
        body = load_params(params)
    except ValueError as e:  # a YAML syntax error: where it is, on one line, not a traceback
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        job = client.submit(body, num_csx=num_csx, labels=parse_labels(label or []), priority=priority)
        out.print(job.id)
        if follow:
            info = job.wait(progress=True)
            out.print(f"{job.id} {info['status']}")
    except (ApiError, JobFailedError) as e:
        raise fail(e) from None


@app.command()
def logs(
    job_id: JobId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new lines until the job ends")
    ] = False,
    url: Url = None,
) -> None:
    """Print a job's log."""
    try:
        job = connect(url).job(job_id)
        printed = 0
        while True:
            lines = job.logs().splitlines()
            for line in lines[printed:]:
                print(line)
            printed = len(lines)
            if not follow or job.status() in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(1.0)
    except ApiError as e:
        raise fail(e) from None


@app.command()
def download(
    job_id: JobId,
    directory: Annotated[Path, typer.Argument(help="where to put checkpoint_<step>/")],
    step: Annotated[int | None, typer.Option(help="this step's checkpoint (default: the last)")] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="replace the checkpoint's files in an existing, non-empty DIRECTORY/checkpoint_<step>/: "
            "every file it downloads, and every weights, index, config, optimizer or trainer-state file "
            "there that it lacks; other files there stay",
        ),
    ] = False,
    url: Url = None,
) -> None:
    """Download a checkpoint of a job into DIRECTORY/checkpoint_<step>/.

    A checkpoint directory that already holds files is refused (exit 2) unless --overwrite: a file left
    there, such as a model.safetensors beside a sharded index, would be loaded instead of the new
    weights. Files arrive in a hidden directory beside it and move in once all are complete."""
    try:
        path = connect(url).job(job_id).download(directory, step, overwrite=overwrite)
        out.print(str(path))
    except CheckpointExistsError as e:
        err.print(
            f"[red]error:[/red] {escape(str(e.path))} already exists and is not empty: a file left there "
            "(a model.safetensors beside a sharded index, say) would be loaded instead of the download's; "
            "choose another directory, or pass --overwrite to replace the checkpoint's files there",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    except (ApiError, OSError) as e:  # OSError: DIRECTORY cannot be written, or is not a directory
        raise fail(e) from None


register(app)  # get, cancel, label, job, log-export, config, dashboard


def main() -> None:
    app()


if __name__ == "__main__":  # python -m weightstream_client.cli, where the wsctl script is not on PATH
    main()

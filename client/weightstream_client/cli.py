"""``wsctl``: submit and follow jobs on a weightstream service (WEIGHTSTREAM_URL, WEIGHTSTREAM_TOKEN)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from weightstream_client._client import ApiError, Client, JobFailedError, load_params

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
out, err = Console(), Console(stderr=True)
Url = Annotated[str | None, typer.Option("--url", envvar="WEIGHTSTREAM_URL", help="service URL")]
JobId = Annotated[str, typer.Argument(help="job id")]


def _client(url: str | None) -> Client:
    try:
        return Client(url)
    except ValueError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _fail(e: Exception) -> typer.Exit:
    err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(2 if isinstance(e, ApiError) and e.status in (400, 401, 404, 409, 413, 422) else 1)


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--label")
        labels[key] = value
    return labels


@app.command()
def submit(
    params: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="params YAML")],
    num_csx: Annotated[int, typer.Option("--num_csx", min=1, help="CS-2 workers")] = 1,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    priority: Annotated[int, typer.Option(min=1, max=3, help="1 runs first")] = 2,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show progress until the job ends")] = False,
    url: Url = None,
) -> None:
    """Submit a job; prints its id (and follows it with --follow)."""
    client = _client(url)
    try:
        body = load_params(params)
    except ValueError as e:  # a YAML syntax error: where it is, on one line, not a traceback
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        job = client.submit(body, num_csx=num_csx, labels=_labels(label or []), priority=priority)
        out.print(job.id)
        if follow:
            info = job.wait(progress=True)
            out.print(f"{job.id} {info['status']}")
    except (ApiError, JobFailedError) as e:
        raise _fail(e) from None


@app.command()
def jobs(
    status: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed or cancelled")
    ] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value, repeatable")] = None,
    url: Url = None,
) -> None:
    """List jobs."""
    try:
        rows = _client(url).jobs(status, _labels(label or []))
    except ApiError as e:
        raise _fail(e) from None
    table = Table("id", "status", "num_csx", "priority", "labels", "submitted")
    for j in rows:
        labels = ",".join(f"{k}={v}" for k, v in j["labels"].items())
        submitted = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["created_at"]))
        table.add_row(j["id"], j["status"], str(j["num_csx"]), str(j["priority"]), labels, submitted)
    out.print(table)


@app.command()
def get(job_id: JobId, url: Url = None) -> None:
    """Show a job as JSON (status history, error, resolved params)."""
    try:
        print(json.dumps(_client(url).job(job_id).info(), indent=2))
    except ApiError as e:
        raise _fail(e) from None


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
        job = _client(url).job(job_id)
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
        raise _fail(e) from None


@app.command()
def cancel(job_id: JobId, url: Url = None) -> None:
    """Cancel a queued or running job."""
    try:
        info = _client(url).job(job_id).cancel()
        out.print(f"{job_id} {info['status']}")
    except ApiError as e:
        raise _fail(e) from None


@app.command()
def download(
    job_id: JobId,
    directory: Annotated[Path, typer.Argument(help="where to put checkpoint_<step>/")],
    step: Annotated[int | None, typer.Option(help="this step's checkpoint (default: the last)")] = None,
    url: Url = None,
) -> None:
    """Download a checkpoint of a job."""
    try:
        path = _client(url).job(job_id).download(directory, step)
        out.print(str(path))
    except ApiError as e:
        raise _fail(e) from None


def main() -> None:
    app()

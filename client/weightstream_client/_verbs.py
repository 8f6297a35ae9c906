"""csctl's verbs in `wsctl`, for users coming from Cerebras: ``get jobs``, ``get job``, ``cancel job``,
``label job``, ``job set-priority``, ``log-export``, ``config view`` and ``dashboard``.

Every request goes through the client library (``_client``); this module parses, prints and exits.
"""

from __future__ import annotations

import sys
import time
import webbrowser
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape
from typer.core import TyperGroup

from weightstream_client._client import ApiError
from weightstream_client._common import JobId, Url, connect, err, fail, parse_labels
from weightstream_client._config import masked, resolve_settings
from weightstream_client._format import (
    JOB_COLUMNS,
    cell,
    dump,
    faults_text,
    job_row,
    labels_text,
    newest_first,
    table,
    with_iso_times,
)

__all__ = ["register"]


class OutputFormat(StrEnum):
    json = "json"
    yaml = "yaml"


Output = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output", "-o", help="json or yaml: every field; default: the columns", show_default=False
    ),
]


class Status(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


LabelFilter = Annotated[list[str] | None, typer.Option("--label", help="key=value, repeatable")]
ACTIVE = ("queued", "running")


class _NounGroup(TyperGroup):
    """``get`` and ``cancel`` take a noun (``job ID``) as csctl does; the earlier ``wsctl get ID`` and
    ``wsctl cancel ID`` exit 2 with the new form, not a bare "No such command"."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            err.print(
                f"[red]error:[/red] {escape(repr(args[0]))} is not a noun of `{ctx.info_name}`: "
                f"did you mean `wsctl {ctx.info_name} job {escape(args[0])}`?",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(2)
        return super().resolve_command(ctx, args)


get_app = typer.Typer(help="Show jobs.", no_args_is_help=True, cls=_NounGroup)
cancel_app = typer.Typer(help="Cancel a job.", no_args_is_help=True, cls=_NounGroup)
label_app = typer.Typer(help="Set or remove labels.", no_args_is_help=True)
job_app = typer.Typer(help="Change a job.", no_args_is_help=True)
config_app = typer.Typer(help="The client's configuration.", no_args_is_help=True)


def _print_jobs(jobs: list[dict[str, Any]], output: OutputFormat | None, one: bool = False) -> None:
    if output is not None:  # times as ISO 8601 UTC: a person reads this, the REST API has the numbers
        shown = [with_iso_times(j) for j in jobs]
        sys.stdout.write(dump(shown[0] if one else shown, output.value))
    else:  # plain text, not rich: a pipe gets every job on one line at its full width
        now = time.time()
        sys.stdout.write(table(JOB_COLUMNS, [job_row(j, now) for j in jobs]))
        if one and jobs[0].get("faults"):
            sys.stdout.write(faults_text(jobs[0]["faults"], jobs[0]["num_csx"]))


@get_app.command("jobs")
def get_jobs(
    active: Annotated[bool, typer.Option("--active", help="queued and running jobs only")] = False,
    status: Annotated[Status | None, typer.Option(help="only jobs in this phase", show_default=False)] = None,
    label: LabelFilter = None,
    output: Output = None,
    url: Url = None,
) -> None:
    """List jobs, newest first, finished ones included (`wsctl jobs` is the same command).

    Columns: NAME (the job id), AGE, DURATION (time spent running), PHASE, SYSTEMS (CS-2 workers),
    DENSITY (the share of weights that may be non-zero: 100% unless the params ask for sparsity), USER,
    LABELS; one job a line, never wrapped."""
    wanted = parse_labels(label or [])
    if active and status is not None:
        raise typer.BadParameter("--active and --status are alternatives: give one", param_hint="--status")
    try:
        c = connect(url)
        if status is not None:
            jobs = c.jobs(status.value, wanted)
        elif active:
            # queued before running: a job that starts between the two requests is in both (kept once,
            # as running), never in neither
            found = {j["id"]: j for status in ACTIVE for j in c.jobs(status, wanted)}
            jobs = list(found.values())
        else:
            jobs = c.jobs(None, wanted)
    except ApiError as e:
        raise fail(e) from None
    _print_jobs([dict(j) for j in newest_first(jobs)], output)


@get_app.command("job")
def get_job(job_id: JobId, output: Output = None, url: Url = None) -> None:
    """Show one job: its columns, or with -o json|yaml everything.

    Everything: status history with timestamps, error, resolved params, user, duration_s, priority."""
    try:
        info = connect(url).job(job_id).info()
    except ApiError as e:
        raise fail(e) from None
    _print_jobs([info], output, one=True)


@cancel_app.command("job")
def cancel_job(job_id: JobId, url: Url = None) -> None:
    """Cancel a queued job at once, or stop a running one.

    A running job ends cancelled once its roles are gone; a finished one cannot be cancelled (exit 2)."""
    try:
        info = connect(url).job(job_id).cancel()
    except ApiError as e:
        raise fail(e) from None
    print(f"{cell(job_id)} {info['status']}")


@label_app.command("job")
def label_job(
    job_id: JobId,
    changes: Annotated[
        list[str], typer.Argument(help="key=value sets a label, key- removes it", show_default=False)
    ],
    url: Url = None,
) -> None:
    """Set (key=value) and remove (key-) labels of a job; prints its labels after.

    Any job, finished ones included; the limits of a submission hold (32 labels, 256 characters)."""
    sets, removes = [], []
    for item in changes:
        if "=" not in item and item.endswith("-") and len(item) > 1:
            removes.append(item[:-1])
        else:
            sets.append(item)
    labels = parse_labels(sets, param_hint="key=value or key-")
    try:
        info = connect(url).job(job_id).set_labels(labels, removes)
    except ApiError as e:
        raise fail(e) from None
    sys.stdout.write(table(("NAME", "LABELS"), [[cell(info["id"]), labels_text(info["labels"])]]))


@job_app.command("set-priority")
def set_priority(
    job_id: JobId,
    priority: Annotated[str, typer.Argument(help="p1, p2 or p3 (or 1, 2, 3): p1 runs first")],
    url: Url = None,
) -> None:
    """Change the priority of a queued or running job (p1 runs first).

    A queued job takes its new place in the queue at once; a finished one cannot change (exit 2)."""
    value = priority.lower().removeprefix("p")
    if value not in ("1", "2", "3"):
        raise typer.BadParameter(f"{priority!r} is not p1, p2 or p3 (or 1, 2, 3)", param_hint="PRIORITY")
    try:
        info = connect(url).job(job_id).set_priority(int(value))
    except ApiError as e:
        raise fail(e) from None
    rows = [[cell(info["id"]), cell(str(info["status"]).upper()), f"p{info['priority']}"]]
    sys.stdout.write(table(("NAME", "PHASE", "PRIORITY"), rows))


def log_export(
    job_id: JobId,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="the archive to write, or a directory for <id>-logs.tar.gz in it (default: .)",
        ),
    ] = None,
    url: Url = None,
) -> None:
    """Download a job's logs as one tar.gz.

    run.log, every role's logs/*.log, params.yaml and metrics.jsonl, under <id>/. The file appears
    complete or not at all (written aside, then renamed)."""
    try:
        path = connect(url).job(job_id).export_logs(output or Path.cwd())
    except (ApiError, OSError, ValueError) as e:  # OSError: the directory to write in is missing
        raise fail(e) from None
    print(path)


@config_app.command("view")
def config_view(url: Url = None) -> None:
    """The configuration in effect: the service URL and the API token, and where each came from.

    The token is masked: only its length is shown."""
    s = resolve_settings(url, None, given_as=("--url", "token="))
    url_from = "the default" if s.url_source == "default" else f"from {s.url_source}"
    token = (
        f"{masked(s.token)}  ({len(s.token)} characters, from {s.token_source})"
        if s.token
        else "not set (set $WEIGHTSTREAM_TOKEN)"
    )
    sys.stdout.write(f"url:    {cell(s.url)}  ({url_from})\ntoken:  {token}\n")


def dashboard(
    job_id: Annotated[
        str | None,
        typer.Argument(help="a job id: the URL opens the dashboard on that job", show_default=False),
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="open it in a web browser too")] = False,
    url: Url = None,
) -> None:
    """Print the service's dashboard URL, with the API token; with JOB_ID, the job's own page
    (/jobs/<id>, the URL to share: without the fragment it holds no token).

    The token is in the URL's fragment (#token=...): a browser never sends a fragment to the server, so
    the token stays out of its logs and of proxies'."""
    s = resolve_settings(url, None, given_as=("--url", "token="))
    if not s.token:
        err.print("[red]error:[/red] no API token: set WEIGHTSTREAM_TOKEN", highlight=False)
        raise typer.Exit(2)
    page = f"/jobs/{quote(job_id, safe='')}" if job_id else "/"
    link = f"{s.url}{page}#token={quote(s.token, safe='')}"
    print(link)
    if open_ and not webbrowser.open(link):
        err.print(f"no web browser found here: open {escape(s.url)}/ yourself", highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the csctl verbs to ``app``, wsctl's root."""
    for name, group in (
        ("get", get_app),
        ("cancel", cancel_app),
        ("label", label_app),
        ("job", job_app),
        ("config", config_app),
    ):
        app.add_typer(group, name=name)
    app.command("jobs", help="List jobs: the same as `wsctl get jobs`.")(get_jobs)
    app.command("log-export")(log_export)
    app.command()(dashboard)

"""Jobs as `wsctl get` prints them: csctl's columns, one job a line, plain fixed-width text.

No rich table here: rich fits a table to the terminal (80 columns when stdout is a pipe) by wrapping cells,
and a wrapped job id is a broken job id for ``grep``, ``awk`` and a person copying it. Every cell is one
line of printable text (a label value with a newline or a terminal escape in it is shown escaped), never
empty (``-``), and columns are as wide as their widest cell.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

__all__ = [
    "JOB_COLUMNS",
    "cell",
    "density_text",
    "dump",
    "faults_text",
    "human_duration",
    "iso_time",
    "job_row",
    "labels_text",
    "newest_first",
    "table",
    "with_iso_times",
]

JOB_COLUMNS = ("NAME", "AGE", "DURATION", "PHASE", "SYSTEMS", "DENSITY", "USER", "LABELS")
GAP = "   "  # between columns: wide enough that a label value's single spaces do not read as a column


def human_duration(seconds: float) -> str:
    """As kubectl shows an age: ``45s``, ``3m12s`` (under 10 minutes), ``42m``, ``5h7m`` (under 8
    hours), ``20h``, ``3d4h`` (under 8 days), ``12d``. Negative (clocks apart) counts as 0."""
    s = max(0, int(seconds))
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if s < 600:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d"


def cell(text: object) -> str:
    """``text`` as one cell: every character that is not printable (a newline, a tab, ESC) escaped as
    Python writes it, so a cell can neither break its line nor drive the terminal; ``-`` if empty."""
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return s or "-"


def labels_text(labels: Mapping[str, str]) -> str:
    """``k=v,k2=v2`` in key order (how ``--label`` and ``wsctl label`` take them), ``-`` for none."""
    return cell(",".join(f"{k}={v}" for k, v in sorted(labels.items())))


def job_row(job: Mapping[str, Any], now: float) -> list[str]:
    """A job (the service's JSON) as the cells of ``JOB_COLUMNS``. DURATION is its time running, over
    every run; ``-`` while it has never run."""
    ran = any(h.get("status") == "running" for h in job.get("history", []))
    duration = human_duration(job.get("duration_s", 0.0)) if ran else "-"
    return [
        cell(job["id"]),
        human_duration(now - job["created_at"]),
        duration,
        cell(str(job["status"]).upper()),
        cell(job["num_csx"]),
        density_text(job.get("density")),
        cell(job.get("user", "")),
        labels_text(job.get("labels", {})),
    ]


def faults_text(faults: Mapping[str, Any], num_csx: int) -> str:
    """A job's fault recovery (the service's ``faults``) as lines under its row: the roles replaced, by
    kind, the workers it trains with when fewer than it asked for, with why, and the newest straggler
    warning, if any."""
    restarts = faults.get("restarts") or {}
    by_kind = ", ".join(f"{cell(k)} {n}" for k, n in sorted(restarts.items()))
    lines = [f"RESTARTS   {sum(restarts.values())}" + (f" ({by_kind})" if by_kind else "")]
    workers = faults.get("workers", num_csx)
    line = f"WORKERS    {workers} of {num_csx}"
    if faults.get("last_workers_change"):
        line += f"   (last change: {cell(faults['last_workers_change'])})"
    lines.append(line)
    if faults.get("last_straggler"):
        lines.append(f"STRAGGLER  {cell(faults['last_straggler'])}")
    return "".join(f"{x}\n" for x in lines)


def density_text(density: float | None) -> str:
    """The model's weight density as a percentage (``100%`` dense, ``10%`` at 90% sparsity); ``-`` from
    a service too old to say."""
    if density is None:
        return "-"
    return f"{100 * density:.3g}%"


def newest_first(jobs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(jobs, key=lambda j: (j["created_at"], j["id"]), reverse=True)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned fixed-width columns, one row a line, no trailing spaces; ends with a newline."""
    rows = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [GAP.join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def iso_time(epoch_s: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC, to the millisecond: ``2026-11-27T23:30:05.120Z``."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_iso_times(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job (the service's JSON, whose times are seconds since the epoch) with ``created_at``,
    ``updated_at`` and each ``history[].at`` as ISO 8601 UTC, for people reading `-o yaml|json`. The
    REST API itself keeps its numbers."""

    def convert(record: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
        out = dict(record)
        for key in keys:
            value = out.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = iso_time(value)
        return out

    shown = convert(job, ("created_at", "updated_at"))
    if isinstance(shown.get("history"), list):
        shown["history"] = [convert(h, ("at",)) if isinstance(h, Mapping) else h for h in shown["history"]]
    return shown


def dump(document: Any, fmt: str) -> str:
    """``document`` as ``json`` (indented) or ``yaml`` (block style, keys in the service's order)."""
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)

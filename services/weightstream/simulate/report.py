"""Showing predictions: a rich table, a JSON document, a PNG (matplotlib, an optional extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from weightstream.simulate.cluster import Cluster
from weightstream.simulate.model import TERMS, Prediction
from weightstream.simulate.workload import Workload

__all__ = [
    "BREAK_EFFICIENCY",
    "PLOT_HINT",
    "breaks_at",
    "breaks_line",
    "document",
    "overhead",
    "plot",
    "table",
]

# Scaling "breaks" at the first N whose efficiency falls below this: past it, a fifth of the workers'
# time is spent waiting, the usual threshold for "stop adding workers, fix the bottleneck".
BREAK_EFFICIENCY = 0.8
PLOT_HINT = 'pip install "weightstream[plot]"'


def overhead(p: Prediction) -> str:
    """The largest term other than compute: what to fix first."""
    return max((t for t in TERMS if t != "compute"), key=lambda t: p.terms[t])


def breaks_at(preds: list[Prediction | None]) -> Prediction | None:
    """The first prediction (in N order) whose efficiency is below BREAK_EFFICIENCY, if any."""
    return next(
        (p for p in sorted((p for p in preds if p), key=lambda p: p.n) if p.efficiency < BREAK_EFFICIENCY),
        None,
    )


def breaks_line(preds: list[Prediction | None]) -> str:
    p = breaks_at(preds)
    if p is None:
        return f"scaling holds: efficiency stays at or above {BREAK_EFFICIENCY:.0%} for every N shown"
    o = overhead(p)
    return (
        f"scaling breaks at N = {p.n}: efficiency {p.efficiency:.0%} < {BREAK_EFFICIENCY:.0%}; "
        f"the largest overhead is {o} ({p.terms[o]:.3g} s of a {p.step_s:.3g} s step)"
    )


def table(cluster: Cluster, workload: Workload, ns: list[int], preds: list[Prediction | None]) -> Table:
    batch = (
        f"{workload.per_worker_batch} samples per worker"
        if workload.per_worker_batch is not None
        else f"global batch {workload.global_batch}"
    )
    t = Table(title=f"{workload.model}; {batch}; cluster {cluster.name}", title_justify="left")
    for col in ("N", "batch/worker", "depth", "step s", "tokens/s", "efficiency", "limit", *TERMS):
        t.add_column(col, justify="left" if col == "limit" else "right")
    for n, p in zip(ns, preds, strict=True):
        if p is None:
            t.add_row(str(n), "-", "-", "-", "-", "-", f"batch {workload.global_batch} does not split in {n}")
            continue
        t.add_row(
            str(n),
            str(p.samples_per_worker),
            str(p.tree_depth),
            f"{p.step_s:.4g}",
            f"{p.tokens_per_s:,.0f}",
            f"{p.efficiency:.0%}",
            p.limit,
            *(f"{p.terms[k]:.3g}" for k in TERMS),
        )
    return t


def document(
    cluster: Cluster, workload: Workload, ns: list[int], preds: list[Prediction | None]
) -> dict[str, Any]:
    """Everything behind the table, as JSON-ready values."""
    br = breaks_at(preds)
    return {
        "model": workload.model,
        "num_params": workload.num_params,
        "per_worker_batch": workload.per_worker_batch,
        "global_batch": workload.global_batch,
        "cluster": cluster.to_dict(),
        "predictions": [
            {"n": n, "error": f"batch {workload.global_batch} does not split in {n}"}
            if p is None
            else {**p.__dict__, "overhead": overhead(p)}
            for n, p in zip(ns, preds, strict=True)
        ],
        "breaks_at": br.n if br else None,
        "break_efficiency": BREAK_EFFICIENCY,
    }


def plot(path: Path, title: str, preds: list[Prediction | None]) -> None:
    """Step time by term (stacked) and efficiency against N. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ps = [p for p in preds if p is not None]
    xs = [str(p.n) for p in ps]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    bottom = [0.0] * len(ps)
    for term in TERMS:
        values = [p.terms[term] for p in ps]
        ax1.bar(xs, values, bottom=bottom, label=term)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax1.set_ylabel("step time (s)")
    ax1.set_title(title, fontsize=9)
    ax1.legend(fontsize=8)
    ax2.plot(xs, [p.efficiency for p in ps], marker="o")
    ax2.axhline(BREAK_EFFICIENCY, linestyle="--", color="grey")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("scaling efficiency")
    ax2.set_xlabel("workers (N)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""The options of ``weightstream run --backend slurm`` and ``serve --backend slurm``: which nodes serve
which role kinds, and the backend they build (backends/slurm/)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from weightstream.backends.slurm.backend import SlurmBackend
    from weightstream.backends.slurm.placement import PlacementRules

__all__ = ["Partition", "ServerFeatures", "WorkerFeatures", "backend_factory", "placement_rules"]

Partition = Annotated[
    str | None, typer.Option(help="with --backend slurm: the partition of every role (default: Slurm's)")
]
WorkerFeatures = Annotated[
    str | None,
    typer.Option(
        "--worker_features",
        help="with --backend slurm: features (comma-separated) of nodes for workers and their activation",
    ),
]
ServerFeatures = Annotated[
    str | None,
    typer.Option(
        "--server_features",
        help="with --backend slurm: features (comma-separated) of nodes for MemoryX and SwarmX",
    ),
]


def _features(text: str | None) -> tuple[str, ...]:
    return tuple(f.strip() for f in (text or "").split(",") if f.strip())


def placement_rules(
    partition: str | None, worker_features: str | None, server_features: str | None
) -> PlacementRules:
    """The placement rules these options say (``run`` and ``serve`` alike)."""
    from weightstream.backends.slurm.placement import NodeRule, PlacementRules

    return PlacementRules(
        workers=NodeRule(partition, _features(worker_features)),
        servers=NodeRule(partition, _features(server_features)),
    )


def backend_factory(
    partition: str | None, worker_features: str | None, server_features: str | None
) -> Callable[[Path], SlurmBackend]:
    """A maker of the job's Slurm backend (given the run's directory) with these placement rules."""
    from weightstream.backends.slurm.backend import SlurmBackend

    rules = placement_rules(partition, worker_features, server_features)

    def make(run_dir: Path) -> SlurmBackend:
        return SlurmBackend(run_dir, "weightstream", rules)

    return make

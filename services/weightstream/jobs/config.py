"""What `weightstream serve` was told: where its data lies, its slots, its backend, the data roots and
limits of the jobs it accepts, and the name of the user who submits through its one token."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path

from weightstream.backends.kubernetes.manifests import ClusterConfig
from weightstream.backends.slurm.placement import PlacementRules
from weightstream.jobs.data_roots import resolve_data_roots
from weightstream.jobs.limits import MAX_LABEL_LENGTH, ServiceLimits

__all__ = ["ServiceConfig", "default_user_name"]


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path
    slots: int  # CS-2 the service may run at once, over all jobs
    # local: processes on this machine; kubernetes: pods in cluster.namespace; slurm: one Slurm job each
    backend: str = "local"
    cluster: ClusterConfig | None = None
    slurm: PlacementRules | None = None  # slurm: which nodes serve which roles (None: any node)
    # where submitted jobs may read data; () means <data_dir>/datasets. Resolved (real paths) on creation
    data_roots: tuple[Path, ...] = ()
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    # who submits through the service's one token: recorded on each job as its user. "": the OS user
    user_name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_roots", resolve_data_roots(self.data_roots, self.data_dir))
        name = self.user_name or default_user_name()
        # one word of printable text: it is a column of `wsctl get jobs`, and a label-like value
        if len(name) > MAX_LABEL_LENGTH or not all(c.isprintable() and not c.isspace() for c in name):
            raise ValueError(
                f"user name {name!r} (serve --user-name): must be 1 to {MAX_LABEL_LENGTH} printable "
                "characters without spaces"
            )
        object.__setattr__(self, "user_name", name)


def default_user_name() -> str:
    """The OS user running the service ($LOGNAME, $USER, ... or the password database), as the USER of
    the jobs it accepts unless ``serve --user-name`` says otherwise."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no $USER
        return f"uid-{os.getuid()}"

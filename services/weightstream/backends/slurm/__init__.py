"""The Slurm backend: a job's roles as steps of one Slurm job, on the nodes a placement chose.

``placement`` decides which node serves which role (a pure function); ``commands`` is the only module of
weightstream that runs Slurm's commands (an import-linter contract keeps it so: nothing else imports
it but ``backend``); ``backend`` drives a job's roles through them.
"""

from weightstream.backends.slurm.placement import (
    Node,
    NodeRule,
    Placement,
    PlacementError,
    PlacementRules,
    place,
)

__all__ = ["Node", "NodeRule", "Placement", "PlacementError", "PlacementRules", "place"]

"""The Slurm backend: a job's roles as steps of one Slurm job, on the nodes a placement chose.

``placement`` decides which node serves which role (a pure function); ``commands`` is the only module of
weightstream that runs Slurm's commands (an import-linter contract keeps it so: nothing else imports
it but ``backend``); ``backend`` drives a job's roles through them. After a fault, ``reach`` tells a
role lost on a live node from a node that is gone, ``placement.replacement`` places the lost roles again,
and ``orphans`` ends the steps a node out of reach kept; ``shared_dir`` checks ``model_dir`` first.
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

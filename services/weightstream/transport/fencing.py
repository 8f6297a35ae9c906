"""Generations: how a role tells the calls of the job's current configuration from those of an earlier one.

When the coordinator recovers from a fault it configures every role again under a new generation (a
counter, 0 at the start). Every call a role or the coordinator makes carries the generation of the
configuration that made it, as call metadata; a role refuses a call of another generation with ABORTED
(``StaleGenerationError``). So a gradient pushed by a worker of the interrupted attempt, still in flight
when the step is re-run, can never be counted twice: each step's gradients come from one generation only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GENERATION_METADATA", "StaleGenerationError", "check_generation", "generation_of"]

GENERATION_METADATA = "x-weightstream-generation"


class StaleGenerationError(RuntimeError):
    """A call made under another generation than the role's current one (the job was reconfigured)."""


def generation_of(metadata: Any) -> int:
    """The generation a call's metadata carries; 0 where it carries none (the first configuration)."""
    for key, value in metadata or ():
        if key == GENERATION_METADATA:
            try:
                return int(value)
            except ValueError:
                raise StaleGenerationError(f"{GENERATION_METADATA} {value!r} is not an integer") from None
    return 0


def check_generation(given: int, current: int, what: str) -> None:
    if given != current:
        raise StaleGenerationError(
            f"{what} of generation {given} refused: this role is at generation {current} (the job was "
            "reconfigured to recover from a fault)"
        )

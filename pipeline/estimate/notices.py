"""What the estimate tells the user beside its numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimateWarning:
    """Something the user should know. ``fails``: it makes the exit code 1."""

    kind: str  # does_not_fit | budget_below_floor | budget_below_prediction | note
    message: str
    fails: bool

"""The records a validation report is built from (shared by the document and its plots)."""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.measure.budgets import BudgetResult
from trtpipe.runtime.metrics.request_metrics import MetricsSummary, RequestMetrics


@dataclass(frozen=True)
class ScenarioReport:
    """One scenario's results: its summary, the budget rows and every request's record."""

    name: str
    summary: MetricsSummary
    budget_results: tuple[BudgetResult, ...]
    requests: tuple[RequestMetrics, ...]


__all__ = ["ScenarioReport"]

"""Latency and throughput budgets: compare a :class:`MetricsSummary` against a recipe's limits.

A recipe hands its budgets over as :class:`Budget` records (validated once, at the recipe edge:
``Budgets.runtime_budgets``); :func:`parse_budget` also takes a plain dict (or any object with the
same attributes):

    {"metric": "ttft_ms", "percentile": "p95", "max": 1500.0}   # latency: an upper bound, in ms
    {"metric": "output_tokens_per_s", "min": 20.0}              # throughput: a lower bound

Latency metrics are ``ttft_ms``, ``tpot_ms``, ``itl_ms`` and ``e2e_ms`` (DESIGN.md "Metrics"),
each at ``p50``, ``p90``, ``p95`` or ``p99`` (linear interpolation, see
:func:`trtpipe.runtime.metrics.request_metrics.percentile`). A budget whose metric has no data (TPOT when every
request produced a single token, say) fails with a reason: an unmeasured budget never passes.

The gate (:func:`gate_exit_code`) is 0 only when every budget passed, correctness passed and,
when it was checked, every KV block was free after the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.metrics.request_metrics import PERCENTILES, MetricsSummary, percentile

LATENCY_BUDGET_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
THROUGHPUT_BUDGET_METRICS: tuple[str, ...] = ("output_tokens_per_s",)
BUDGET_METRICS: tuple[str, ...] = LATENCY_BUDGET_METRICS + THROUGHPUT_BUDGET_METRICS

_NO_DATA_WHY = {
    "ttft_ms": "no request produced an output token",
    "e2e_ms": "no request produced an output token",
    "tpot_ms": "no request produced 2 or more output tokens (TPOT excludes the first token)",
    "itl_ms": "no request produced 2 or more output tokens, so there is no inter-token gap",
    "output_tokens_per_s": "the run's wall time is 0 s",
}


class BudgetError(TrtpipeError, ValueError):
    """A budget spec is malformed (unknown metric, missing percentile, bad limit...)."""


class _MetricNames:
    """``unit`` and ``label`` of a record with ``metric`` and ``percentile`` fields."""

    metric: str
    percentile: str | None

    @property
    def unit(self) -> str:
        if self.metric == "itl_during_prefill_ratio":
            return "x"
        return "tokens/s" if self.metric in THROUGHPUT_BUDGET_METRICS else "ms"

    @property
    def label(self) -> str:
        """Human name, e.g. ``ttft_ms p95`` or ``output_tokens_per_s``."""
        return self.metric if self.percentile is None else f"{self.metric} {self.percentile}"


@dataclass(frozen=True)
class Budget(_MetricNames):
    """One validated budget. ``kind`` is "max" (latency, ms) or "min" (throughput, tokens/s)."""

    metric: str
    percentile: str | None  # "p50" | "p90" | "p95" | "p99"; None for throughput
    kind: str
    limit: float


@dataclass(frozen=True)
class BudgetResult(_MetricNames):
    """One row of the gate table.

    ``limit`` and ``measured`` are in the metric's unit (ms, or tokens/s). ``margin`` is a
    fraction of the limit, positive when there is headroom: ``(limit - measured) / limit`` for a
    max budget and ``(measured - limit) / limit`` for a min budget; ``None`` without data.
    """

    metric: str
    percentile: str | None
    kind: str  # "max" | "min"
    limit: float
    measured: float | None
    margin: float | None
    passed: bool
    reason: str = ""

    def to_dict(self) -> dict:
        return {
            "metric": self.metric,
            "percentile": self.percentile,
            "kind": self.kind,
            "limit": self.limit,
            "unit": self.unit,
            "measured": self.measured,
            "margin": self.margin,
            "passed": self.passed,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BudgetResult:
        return cls(
            metric=d["metric"],
            percentile=d["percentile"],
            kind=d["kind"],
            limit=d["limit"],
            measured=d["measured"],
            margin=d["margin"],
            passed=d["passed"],
            reason=d.get("reason", ""),
        )


def _field(spec: Any, key: str) -> Any:
    """``spec[key]`` for a mapping, else ``getattr(spec, key, None)`` (recipe model objects)."""
    if isinstance(spec, Mapping):
        return spec.get(key)
    return getattr(spec, key, None)


def parse_budget(spec: Any) -> Budget:
    """Validate one budget spec (dict or object); raises :class:`BudgetError` naming the fix."""
    metric = _field(spec, "metric")
    if metric not in BUDGET_METRICS:
        raise BudgetError(
            f"budget metric={metric!r}: expected one of {', '.join(BUDGET_METRICS)}; "
            'e.g. {"metric": "ttft_ms", "percentile": "p95", "max": 1500}'
        )
    upper, lower = _field(spec, "max"), _field(spec, "min")
    if (upper is None) == (lower is None):
        raise BudgetError(
            f"budget {metric}: give exactly one of max / min (got max={upper!r}, min={lower!r}); "
            "latency budgets take max (ms), output_tokens_per_s takes min"
        )
    kind, limit = ("max", upper) if upper is not None else ("min", lower)
    want = "min" if metric in THROUGHPUT_BUDGET_METRICS else "max"
    if kind != want:
        raise BudgetError(
            f"budget {metric}: {kind}={limit!r} is not supported; {metric} takes {want} "
            f"({'a lower bound on throughput' if want == 'min' else 'an upper bound on latency'})"
        )
    try:
        limit = float(limit)
    except (TypeError, ValueError):
        raise BudgetError(f"budget {metric}: {kind}={limit!r} is not a number") from None
    if not math.isfinite(limit) or limit <= 0:
        raise BudgetError(f"budget {metric}: {kind}={limit!r}, expected a finite number > 0")

    pct = _field(spec, "percentile")
    if metric in THROUGHPUT_BUDGET_METRICS:
        if pct is not None:
            raise BudgetError(f"budget {metric}: percentile={pct!r} does not apply to a throughput; remove it")
        return Budget(metric=metric, percentile=None, kind=kind, limit=limit)
    pct = _normalize_percentile(metric, pct)
    return Budget(metric=metric, percentile=pct, kind=kind, limit=limit)


def _normalize_percentile(metric: str, pct: Any) -> str:
    """Accept "p95", "P95", 95 or "95"; return "p95"."""
    if isinstance(pct, (int, float)) and not isinstance(pct, bool):
        text = f"p{pct:g}"
    elif isinstance(pct, str):
        text = pct.strip().lower()
        text = text if text.startswith("p") else f"p{text}"
    else:
        text = None
    if text not in PERCENTILES:
        raise BudgetError(f"budget {metric}: percentile={pct!r}, expected one of {', '.join(PERCENTILES)}")
    return text


def evaluate_budgets(summary: MetricsSummary, budgets: Iterable[Any]) -> list[BudgetResult]:
    """Compare ``summary`` with each budget, in order; one :class:`BudgetResult` per budget.

    Raises :class:`BudgetError` for a malformed spec (a config error, not a failed budget).
    """
    results = []
    for spec in budgets:
        b = spec if isinstance(spec, Budget) else parse_budget(spec)
        if b.metric in THROUGHPUT_BUDGET_METRICS:
            measured = summary.output_tokens_per_s
        elif b.percentile is None:  # parse_budget gives every latency budget one; a hand-made Budget may not
            raise BudgetError(f"budget {b.metric}: a latency budget needs a percentile (one of p50, p90, p95, p99)")
        else:
            measured = summary.latency_ms(b.metric.removesuffix("_ms"), b.percentile)
        if measured is None or math.isnan(measured):
            results.append(
                BudgetResult(
                    metric=b.metric, percentile=b.percentile, kind=b.kind, limit=b.limit,
                    measured=None, margin=None, passed=False,
                    reason=f"no data: {_NO_DATA_WHY[b.metric]}",
                )
            )  # fmt: skip
            continue
        if b.kind == "max":
            margin = (b.limit - measured) / b.limit
            passed = measured <= b.limit
        else:
            margin = (measured - b.limit) / b.limit
            passed = measured >= b.limit
        op = "<=" if b.kind == "max" else ">="
        reason = (
            f"{measured:.4g} {op} {b.limit:.4g} {b.unit}"
            if passed
            else f"{measured:.4g} {b.unit} violates {op} {b.limit:.4g}"
        )
        results.append(
            BudgetResult(
                metric=b.metric, percentile=b.percentile, kind=b.kind, limit=b.limit,
                measured=measured, margin=margin, passed=passed, reason=reason,
            )
        )  # fmt: skip
    return results


def evaluate_probe_budgets(probe: Any, budgets: Iterable[Budget]) -> list[BudgetResult]:
    """The engine probes' budgets (``cancel_ms`` at a percentile; ``itl_during_prefill_ratio``: p95
    of the gaps during a partner's prefill / p95 of the steady gaps) against ``probe``, a
    :class:`~trtpipe.runtime.measure.engine_probes.ProbeResult`; no data fails with the reason."""
    results = []
    for b in budgets:
        q = float(str(b.percentile or "p95")[1:])
        measured: float | None = None
        why = "no cancel was measured"
        if b.metric == "cancel_ms" and probe.cancel_ms:
            measured = percentile(probe.cancel_ms, q)
        elif b.metric == "itl_during_prefill_ratio":
            why = "the decoding request had no gap during a partner's prefill, or no steady gap"
            if probe.itl_steady_ms and probe.itl_during_prefill_ms:
                measured = percentile(probe.itl_during_prefill_ms, q) / max(1e-9, percentile(probe.itl_steady_ms, q))
        if measured is None:
            results.append(BudgetResult(b.metric, b.percentile, b.kind, b.limit, None, None, False, f"no data: {why}"))
            continue
        passed = measured <= b.limit
        reason = (
            f"{measured:.4g} <= {b.limit:.4g} {b.unit}"
            if passed
            else f"{measured:.4g} {b.unit} violates <= {b.limit:.4g}"
        )
        if b.metric == "itl_during_prefill_ratio" and probe.partner_ttft_ms:
            reason += f"; the partners' TTFT p50 {percentile(probe.partner_ttft_ms, 50):.0f} ms"
        results.append(
            BudgetResult(
                b.metric, b.percentile, b.kind, b.limit, measured, (b.limit - measured) / b.limit, passed, reason
            )
        )
    return results


def gate_exit_code(results: Sequence[BudgetResult], correctness_ok: bool, *, kv_leak_free: bool | None = None) -> int:
    """0 when every budget passed, correctness passed and no KV block leaked; else 1.

    ``kv_leak_free=None`` means the leak check was not run and does not affect the gate.
    """
    ok = bool(correctness_ok) and all(r.passed for r in results) and kv_leak_free is not False
    return 0 if ok else 1


@dataclass(frozen=True)
class Gate:
    """The validate gate, computed once (:meth:`of`) and then printed and written as it is.

    ``correctness_passed`` / ``kv_leak_free``: None when that check was not run (it then does not
    affect the gate). ``exit_code``: 0 pass, 1 fail (:func:`gate_exit_code`).
    """

    budgets_passed: bool
    correctness_passed: bool | None
    kv_leak_free: bool | None
    exit_code: int

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def of(cls, results: Sequence[BudgetResult], correctness_passed: bool | None, kv_leak_free: bool | None) -> Gate:
        """The gate over every scenario's budget rows, the correctness verdict and the leak check."""
        code = gate_exit_code(results, correctness_passed is not False, kv_leak_free=kv_leak_free)
        return cls(all(r.passed for r in results), correctness_passed, kv_leak_free, code)

    def to_dict(self) -> dict:
        """report.json's ``gate`` object."""
        return {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "budgets_passed": self.budgets_passed,
            "correctness_passed": self.correctness_passed,
            "kv_leak_free": self.kv_leak_free,
        }


__all__ = [
    "BUDGET_METRICS",
    "LATENCY_BUDGET_METRICS",
    "THROUGHPUT_BUDGET_METRICS",
    "Budget",
    "BudgetError",
    "BudgetResult",
    "Gate",
    "evaluate_budgets",
    "evaluate_probe_budgets",
    "gate_exit_code",
    "parse_budget",
]

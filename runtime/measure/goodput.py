"""Goodput: the highest Poisson arrival rate at which a scenario still meets its budgets.

Follows the goodput definition of DistServe (Zhong et al., OSDI 2024): the request rate a
deployment sustains while its latency SLOs hold, found by search over the offered load. The
search is bounded (probes and seconds) and works on any ``probe(rate) -> ProbeResult`` (an
in-process engine, or a server over HTTP)::

    rate = start                      probe; pass -> double until a probe fails
                                             fail -> halve until a probe passes
    [lo pass, hi fail]                bisect geometrically until hi / lo <= 1 + rel_tol,
                                      or max_probes / time_budget_s run out
    goodput = lo                      (None when no probed rate passed)

Latency grows with load (queueing), so "passes at r" is monotone in r up to the noise of the
machine; a noisy probe can only make the result conservative or optimistic by one bracket.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProbeResult:
    """One run of the scenario at ``rate_per_s``: did every budget hold, and what it achieved."""

    rate_per_s: float
    passed: bool
    output_tokens_per_s: float | None = None
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # e.g. {"ttft_p95": 180.0}
    seconds: float = 0.0


@dataclass(frozen=True)
class GoodputResult:
    """The search's answer: ``goodput_per_s`` (None = even the lowest probed rate failed)."""

    scenario: str
    goodput_per_s: float | None
    output_tokens_per_s: float | None  # achieved at the goodput rate's probe
    bracket: tuple[float | None, float | None]  # (highest passing, lowest failing) rate
    probes: tuple[ProbeResult, ...]
    stopped: str  # "converged", "max_probes", "time_budget", "min_rate"

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "goodput_requests_per_s": self.goodput_per_s,
            "goodput_output_tokens_per_s": self.output_tokens_per_s,
            "bracket_requests_per_s": list(self.bracket),
            "stopped": self.stopped,
            "probes": [
                {
                    "rate_per_s": p.rate_per_s,
                    "passed": p.passed,
                    "seconds": round(p.seconds, 2),
                    "output_tokens_per_s": p.output_tokens_per_s,
                    **p.latency_ms,
                }
                for p in self.probes
            ],
        }


def find_goodput(
    scenario: str,
    probe: Callable[[float], ProbeResult],
    start_rate_per_s: float,
    *,
    rel_tol: float = 0.15,
    max_probes: int = 8,
    time_budget_s: float = 600.0,
    min_rate_per_s: float = 1e-3,
    clock: Callable[[], float] = time.monotonic,
) -> GoodputResult:
    """Search the highest passing rate (see module docstring). ``rel_tol``: the final bracket's
    relative width (0.15: the answer is within 15% below the true threshold)."""
    _check_search(start_rate_per_s, rel_tol, max_probes)
    t0 = clock()
    probes: list[ProbeResult] = []
    best: ProbeResult | None = None
    lo: float | None = None
    hi: float | None = None

    def run(rate: float) -> bool:
        nonlocal best, lo, hi
        r = probe(rate)
        probes.append(r)
        if r.passed and (lo is None or rate > lo):
            lo, best = rate, r
        if not r.passed and (hi is None or rate < hi):
            hi = rate
        return r.passed

    def out_of(reason_if_any: str | None = None) -> str | None:
        if len(probes) >= max_probes:
            return "max_probes"
        if clock() - t0 >= time_budget_s:
            return "time_budget"
        return reason_if_any

    rate = start_rate_per_s
    stopped = None
    passed = run(rate)
    while stopped is None and (lo is None or hi is None):  # find a bracket
        stopped = out_of()
        if stopped:
            break
        rate = rate * 2 if passed else rate / 2
        if rate < min_rate_per_s:
            stopped = "min_rate"
            break
        passed = run(rate)
    while stopped is None:  # bisect it
        assert lo is not None and hi is not None
        if hi / lo <= 1 + rel_tol:
            stopped = "converged"
            break
        stopped = out_of()
        if stopped:
            break
        run(math.sqrt(lo * hi))
    return GoodputResult(scenario, lo, best.output_tokens_per_s if best else None, (lo, hi), tuple(probes), stopped)


def _check_search(start_rate_per_s: float, rel_tol: float, max_probes: int) -> None:
    """ValueError naming the values unless the search can start."""
    if not (start_rate_per_s > 0 and rel_tol > 0 and max_probes >= 1):
        raise ValueError(
            f"start_rate_per_s={start_rate_per_s}, rel_tol={rel_tol}, max_probes={max_probes}: "
            "expected all > 0 (max_probes >= 1)"
        )


__all__ = ["GoodputResult", "ProbeResult", "find_goodput"]

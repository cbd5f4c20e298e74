"""bench/serve.py, the figures of one run from its per-request records, as DistServe defines them
(Zhong et al., OSDI 2024): a request is *good* when its own TTFT <= 200 ms and its own TPOT <= 50 ms
(the seed article's customer-service budget); the SLO attainment at a rate is the share of the
requests **sent** that were good, so a rejected request (503), a failed one and one that never
finished (a timeout) are misses; the capacity at the SLOs is the highest Poisson rate whose
attainment is >= 90 %.

Per-request record (either client's, bench/serve_clients.py): ``{"ok": bool, "ttft_ms": float,
"tpot_ms": float | None (one output token: no TPOT), "itl_ms": [gap between consecutive tokens,
ms], "output_tokens": int, "error": str | None, "status": int | None}``.

Percentiles are nearest-rank (the smallest value with at least q % of the population at or below
it), over every request sent: a request without a value (failed, rejected, unfinished) counts as
+inf, so TTFT p95 is infinite when more than 5 % of the requests got no first token.
"""

from __future__ import annotations

import math

TTFT_SLO_MS = 200.0
TPOT_SLO_MS = 50.0
ATTAINMENT_TARGET = 0.9


def is_good(r: dict, ttft_ms: float = TTFT_SLO_MS, tpot_ms: float = TPOT_SLO_MS) -> bool:
    """Whether one request met both budgets (a failed one never does)."""
    if not r.get("ok") or r.get("ttft_ms") is None:
        return False
    return r["ttft_ms"] <= ttft_ms and (r.get("tpot_ms") is None or r["tpot_ms"] <= tpot_ms)


def nearest_rank(values: list[float], q: float, population: int | None = None) -> float | None:
    """The q-th percentile (0 < q <= 100) by nearest rank over ``population`` items (default
    ``len(values)``), the ones not in ``values`` taken as +inf. None for an empty population."""
    n = len(values) if population is None else population
    if n <= 0:
        return None
    if len(values) > n:
        raise ValueError(f"{len(values)} values for a population of {n}")
    k = max(1, math.ceil(q / 100.0 * n))  # 1-based rank
    xs = sorted(values)
    return xs[k - 1] if k <= len(xs) else math.inf


def run_figures(records: list[dict], sent: int, duration_s: float) -> dict:
    """The figures of one run: counts, attainment, goodput (good requests / duration), TTFT p50/p95
    and TPOT p50/p95 over the requests sent, ITL p99 over every token gap of the finished ones."""
    if sent < len(records):
        raise ValueError(f"{len(records)} records for {sent} requests sent")
    ok = [r for r in records if r.get("ok")]
    good = sum(is_good(r) for r in records)
    ttft = [r["ttft_ms"] for r in ok if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in ok if r.get("tpot_ms") is not None]
    gaps = [g for r in ok for g in r.get("itl_ms") or ()]
    return {
        "sent": sent,
        "done": len(ok),
        "rejected": sum(1 for r in records if not r.get("ok") and r.get("status") in (429, 503)),
        "failed": sum(1 for r in records if not r.get("ok") and r.get("status") not in (429, 503)),
        "unfinished": sent - len(records),
        "good": good,
        "attainment": good / sent if sent else None,
        "goodput_rps": good / duration_s if duration_s > 0 else None,
        "output_tokens_per_s": sum(r.get("output_tokens", 0) for r in ok) / duration_s if duration_s > 0 else None,
        "duration_s": duration_s,
        "ttft_p50_ms": nearest_rank(ttft, 50, sent),
        "ttft_p95_ms": nearest_rank(ttft, 95, sent),
        "tpot_p50_ms": nearest_rank(tpot, 50, sent),
        "tpot_p95_ms": nearest_rank(tpot, 95, sent),
        "itl_p99_ms": nearest_rank(gaps, 99),
    }


def capacity_at_slo(attainment_by_rate: dict[float, float | None], target: float = ATTAINMENT_TARGET) -> float | None:
    """The highest rate whose attainment is >= ``target`` (None when no rate is)."""
    ok = [r for r, a in attainment_by_rate.items() if a is not None and a >= target]
    return max(ok) if ok else None


def pick_rates(capacity_rps: dict[str, float], n: int = 5, low: float = 0.25, high: float = 1.25) -> list[float]:
    """``n`` Poisson rates, geometrically spaced from ``low`` x the slowest server's probed capacity
    to ``high`` x the fastest one's, so the lowest is easy for every server and the highest
    saturates every one. Rounded to 3 significant digits."""
    if n < 2:
        raise ValueError(f"n={n}: need at least 2 rates")
    caps = [c for c in capacity_rps.values() if c and c > 0]
    if not caps:
        raise ValueError(f"no positive capacity in {capacity_rps}")
    lo, hi = low * min(caps), high * max(caps)
    step = (hi / lo) ** (1.0 / (n - 1))
    return [float(f"{lo * step**i:.3g}") for i in range(n)]

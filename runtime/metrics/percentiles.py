"""Percentiles of latency samples: the interpolation every report names, and the summary record.

Linear interpolation between closest ranks, the same as ``numpy.percentile(values, q,
method="linear")`` (numpy's default; Hyndman & Fan 1996, type 7). No numpy here: the metrics run
on an embedded target as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trtpipe.runtime.errors import MetricsError

PERCENTILE_METHOD = "linear (numpy default, Hyndman-Fan type 7)"
"""How :func:`percentile` interpolates; written into every report next to the numbers."""

PERCENTILES: tuple[str, ...] = ("p50", "p90", "p95", "p99")
"""The percentiles every summary reports (and every latency budget may name)."""


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (``0 <= q <= 100``) of ``values``, by linear interpolation.

    Linear interpolation between closest ranks, identical to
    ``numpy.percentile(values, q, method="linear")`` (numpy's default; Hyndman & Fan type 7):
    with the values sorted as ``x[0..n-1]`` and ``h = (n - 1) * q / 100``, the result is
    ``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``.
    Example: ``[1, 2, 3, 4]`` gives p50 = 2.5 and p90 = 3.7.

    Raises :class:`MetricsError` on an empty input or ``q`` outside [0, 100].
    """
    xs = sorted(float(v) for v in values)
    if not xs:
        raise MetricsError("percentile of an empty list: there is no data to summarize")
    if not 0.0 <= q <= 100.0:
        raise MetricsError(f"percentile q={q!r}: expected 0 <= q <= 100")
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    if lo + 1 >= len(xs):
        return xs[-1]
    return xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


@dataclass(frozen=True)
class Percentiles:
    """Distribution of one metric, in seconds (``count`` samples)."""

    p50: float
    p90: float
    p95: float
    p99: float
    mean: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles | None:
        """Summarize ``values`` (seconds); ``None`` when there are none."""
        if not values:
            return None
        return cls(
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
            mean=math.fsum(values) / len(values),
            min=min(values),
            max=max(values),
            count=len(values),
        )

    def get(self, name: str) -> float:
        """Value of ``name`` ("p50", "p90", "p95", "p99", "mean", "min", "max"), in seconds."""
        if name not in (*PERCENTILES, "mean", "min", "max"):
            raise MetricsError(f"percentile {name!r}: expected one of {', '.join(PERCENTILES)}")
        return getattr(self, name)

    def to_ms_dict(self) -> dict:
        """JSON-ready dict in milliseconds (``count`` stays a count)."""
        out = {k: getattr(self, k) * 1000.0 for k in (*PERCENTILES, "mean", "min", "max")}
        out["count"] = self.count
        return out


__all__ = ["PERCENTILE_METHOD", "PERCENTILES", "Percentiles", "percentile"]

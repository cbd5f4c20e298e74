"""Request and step metrics: TTFT, TPOT, ITL, E2E, percentiles, per-step counters, decode bandwidth."""

"""bench/peers.py, the targets of issue 26 (and issue 7's runtime overhead): each measured figure
against its goal, as table rows (what, measured, met?, note) for the report's targets section.
The byte, bandwidth and GEMM-peak targets of issue 26 need the engine's own bytes per step; they
are worked out in the report's hand-written analysis.
"""

from __future__ import annotations

from statistics import median

from peers_setup import OWN_ENGINES
from peers_workload import PROMPT_LENGTHS

TARGET_LATENCY_RATIO = 0.9  # trtpipe TTFT and TPOT <= 0.9 x the fastest peer, whatever its quality (issue 26)
TARGET_THROUGHPUT_RATIO = 1.5  # trtpipe 8-request throughput >= 1.5 x the best peer
TARGET_OVERHEAD = 0.10  # Python runtime overhead <= 10 % of TPOT (issue 7)
TARGET_MEMORY_FACTOR = 1.1  # peak RSS <= 1.1 x (weights + KV pool)

TargetRow = tuple[str, str, bool | None, str]


def fmt_ms(x):
    """Seconds -> milliseconds text ("—" for None; one decimal under 0.1 s)."""
    return "—" if x is None else (f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}")


def _ratio_row(what: str, mine: float, theirs: float, target: float) -> TargetRow:
    r = mine / theirs
    note = "" if r <= target else f"short by {(r / target - 1) * 100:.0f} % (need <= {fmt_ms(theirs * target)} ms)"
    return (what, f"{fmt_ms(mine)} vs {fmt_ms(theirs)} ms = {r:.2f}x", r <= target, note)


def _latency_targets(t: dict, peers: dict) -> list[TargetRow]:
    """TTFT and TPOT at each prompt length against the fastest peer at that length, whatever its
    quality (the agreement of each peer is bench/peer_quality.py's)."""
    rows: list[TargetRow] = []
    for metric, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
        for n in PROMPT_LENGTHS:
            best = min(peers.items(), key=lambda kv: kv[1][key][n], default=None)
            if best is None:
                rows.append((f"{metric} @{n} <= 0.9x fastest peer", "no peer ran", None, ""))
                continue
            what = f"{metric} @{n} <= 0.9x fastest peer ({best[0]})"
            rows.append(_ratio_row(what, t[key][n], best[1][key][n], TARGET_LATENCY_RATIO))
    return rows


def _spread_target(t: dict, peers: dict) -> list[TargetRow]:
    """trtpipe's run-to-run spread (max / min of its TPOT over the clean runs, worst prompt length)
    against the median of the peers' (no row unless trtpipe and a peer have two runs or more)."""
    theirs = {e: s["spread"] for e, s in peers.items() if s.get("spread")}
    if not t.get("spread") or not theirs:
        return []
    bar = median(theirs.values())
    listed = ", ".join(f"{e} {v:.2f}x" for e, v in sorted(theirs.items()))
    return [
        (
            "TPOT spread over runs <= the peers' (median)",
            f"{t['spread']:.2f}x vs {bar:.2f}x",
            t["spread"] <= bar,
            f"max/min over each engine's clean runs, worst of 16/128/512 tokens; peers: {listed}",
        )
    ]


def _throughput_target(t: dict, peers: dict) -> list[TargetRow]:
    """8-request throughput against the best peer's (no row when no peer ran)."""
    best = max(peers.items(), key=lambda kv: kv[1]["tps"], default=None)
    if not best:
        return []
    r = t["tps"] / best[1]["tps"]
    return [
        (
            f"8-request throughput >= 1.5x best peer ({best[0]})",
            f"{t['tps']:.0f} vs {best[1]['tps']:.0f} tok/s = {r:.2f}x",
            r >= TARGET_THROUGHPUT_RATIO,
            "" if r >= TARGET_THROUGHPUT_RATIO else f"short by {(1 - r / TARGET_THROUGHPUT_RATIO) * 100:.0f} %",
        )
    ]


def _overhead_target(profile: dict) -> list[TargetRow]:
    """Python runtime overhead as a fraction of TPOT (no row without a decode profile)."""
    if not profile or "error" in profile:
        return []
    o = profile["overhead_fraction"]
    return [
        (
            "runtime overhead <= 10 % of TPOT (batch 1)",
            f"{o * 100:.1f} %",
            o <= TARGET_OVERHEAD,
            "" if o <= TARGET_OVERHEAD else f"{(o - TARGET_OVERHEAD) * 100:.1f} points over",
        )
    ]


def _memory_target(t: dict) -> list[TargetRow]:
    """Peak RSS against 1.1 x (weights + KV pool) bytes (no row without the weights size)."""
    ex = t.get("extra", {})
    if not ex.get("weights_bytes"):
        return []
    budget = TARGET_MEMORY_FACTOR * (ex["weights_bytes"] + ex["kv_pool_bytes"])
    r = t["peak_rss_bytes"] / (ex["weights_bytes"] + ex["kv_pool_bytes"])
    return [
        (
            f"peak RSS <= {TARGET_MEMORY_FACTOR}x (weights + KV pool)",
            f"{t['peak_rss_bytes'] / 2**20:.0f} MiB vs budget {budget / 2**20:.0f} MiB = {r:.2f}x",
            t["peak_rss_bytes"] <= budget,
            "",
        )
    ]


def targets(summary: dict, profile: dict) -> list[TargetRow]:
    """(what, measured, met?, note) for each target of issue 26 this report can score (and issue 7's
    overhead)."""
    t = summary.get("trtpipe", {})
    peers = {e: s for e, s in summary.items() if e not in OWN_ENGINES and "error" not in s}
    if "error" in t or not t:
        return [("trtpipe", "no result", None, t.get("error", "not run"))]
    fast = summary.get("trtpipe-fast", {})
    fast_rows = [] if "error" in fast or not fast else _latency_targets(fast, peers) + _throughput_target(fast, peers)
    return (
        _latency_targets(t, peers)
        + [(f"fast recipe: {what}", measured, met, note) for what, measured, met, note in fast_rows]
        + _throughput_target(t, peers)
        + _spread_target(t, peers)
        + _memory_target(t)
        + _overhead_target(profile)
    )

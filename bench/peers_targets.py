"""bench/peers.py, the targets of issue 7: each measured figure against its goal, as table rows
(what, measured, met?, note) for the report's targets section.
"""

from __future__ import annotations

from peers_workload import PROMPT_LENGTHS

# Targets of issue 7.
TARGET_LATENCY_RATIO = 0.9  # trtpipe TTFT and TPOT <= 0.9 x the best peer
TARGET_THROUGHPUT_RATIO = 1.5  # trtpipe 8-request throughput >= 1.5 x the best peer
TARGET_OVERHEAD = 0.10  # Python runtime overhead <= 10 % of TPOT
TARGET_MEMORY_FACTOR = 1.3  # peak RSS <= 1.3 x (weights + KV pool)

TargetRow = tuple[str, str, bool | None, str]


def fmt_ms(x):
    """Seconds -> milliseconds text ("—" for None; one decimal under 0.1 s)."""
    return "—" if x is None else (f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}")


def _latency_targets(t: dict, peers: dict) -> list[TargetRow]:
    """TTFT and TPOT at each prompt length against the best peer at that length."""
    rows: list[TargetRow] = []
    for metric, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
        for n in PROMPT_LENGTHS:
            best = min(peers.items(), key=lambda kv: kv[1][key][n], default=None)
            if best is None:
                rows.append((f"{metric} @{n} <= 0.9x best peer", "no peer ran", None, ""))
                continue
            r = t[key][n] / best[1][key][n]
            note = (
                ""
                if r <= TARGET_LATENCY_RATIO
                else (
                    f"short by {(r / TARGET_LATENCY_RATIO - 1) * 100:.0f} % "
                    f"(need <= {fmt_ms(best[1][key][n] * TARGET_LATENCY_RATIO)} ms)"
                )
            )
            rows.append(
                (
                    f"{metric} @{n} <= 0.9x best peer ({best[0]})",
                    f"{fmt_ms(t[key][n])} vs {fmt_ms(best[1][key][n])} ms = {r:.2f}x",
                    r <= TARGET_LATENCY_RATIO,
                    note,
                )
            )
    return rows


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
    """Peak RSS against 1.3 x (weights + KV pool) bytes (no row without the weights size)."""
    ex = t.get("extra", {})
    if not ex.get("weights_bytes"):
        return []
    budget = TARGET_MEMORY_FACTOR * (ex["weights_bytes"] + ex["kv_pool_bytes"])
    r = t["peak_rss_bytes"] / (ex["weights_bytes"] + ex["kv_pool_bytes"])
    return [
        (
            "peak RSS <= 1.3x (weights + KV pool)",
            f"{t['peak_rss_bytes'] / 2**20:.0f} MiB vs budget {budget / 2**20:.0f} MiB = {r:.2f}x",
            t["peak_rss_bytes"] <= budget,
            "",
        )
    ]


def targets(summary: dict, profile: dict) -> list[TargetRow]:
    """(what, measured, met?, note) for each target of issue 7."""
    t = summary.get("trtpipe", {})
    peers = {e: s for e, s in summary.items() if e != "trtpipe" and "error" not in s}
    if "error" in t or not t:
        return [("trtpipe", "no result", None, t.get("error", "not run"))]
    return _latency_targets(t, peers) + _throughput_target(t, peers) + _overhead_target(profile) + _memory_target(t)

"""report.md: the validation report (report.json's document) as markdown tables.

One section per scenario (latency percentiles, run facts, decode bandwidth, budget table), then
correctness, environment and plots. Input: the dict :func:`trtpipe.runtime.measure.report.document.build_report`
returns (or :func:`~trtpipe.runtime.measure.report.document.load_report` reads back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtpipe.runtime.metrics.decode_bandwidth import DecodeBandwidth
from trtpipe.runtime.metrics.request_metrics import LATENCY_METRICS, PERCENTILES


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _opt(x: Any) -> str:
    return "–" if x is None else str(x)


def fmt_margin(m: float | None) -> str:
    return "–" if m is None else f"{m * 100:+.1f}%"


def _fmt_bytes(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f} MiB"


def _pass(flag: bool | None) -> str:
    return "not checked" if flag is None else ("PASS" if flag else "FAIL")


def render_markdown(doc: Mapping[str, Any]) -> str:
    """report.md from the report.json document."""
    gate = doc["gate"]
    lines = [
        f"# Validation report: {doc['recipe']} on {doc['target']}",
        "",
        f"**Gate: {'PASS' if gate['passed'] else 'FAIL'}** (exit code {gate['exit_code']}); "
        f"budgets {_pass(gate['budgets_passed'])}, "
        f"correctness {_pass(gate['correctness_passed'])}, "
        f"KV leak check {_pass(gate['kv_leak_free'])}.",
        "",
        f"Generated {doc['generated_at']}. Percentile interpolation: {doc['percentile_method']}. "
        "TTFT is measured from arrival (queueing included); TPOT excludes the first token and is "
        "undefined for single-token requests; ITL is over all token gaps (DESIGN.md, Metrics).",
        "",
    ]
    for s in doc["scenarios"]:
        lines += _scenario_markdown(s)
    lines += ["## Correctness", ""]
    if doc["correctness"]:
        lines += [f"- {k}: {v}" for k, v in doc["correctness"].items()]
    else:
        lines.append("- not checked")
    lines += ["", "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in doc["env"].items()] or ["- (none recorded)"]
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in doc["plots"]] or ["- not drawn (matplotlib is not installed)"]
    return "\n".join(lines) + "\n"


def _scenario_markdown(s: Mapping[str, Any]) -> list[str]:
    """report.md lines of one scenario: latency table, run facts, budget table."""
    sm = s["summary"]
    lines = [f"## Scenario `{s['name']}`", ""]
    lines += ["| metric | p50 | p90 | p95 | p99 | mean | n |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in LATENCY_METRICS:
        d = sm[f"{name}_ms"]
        label = {"prefill": "prefill (only)", "queue": "queue"}.get(name, name)
        if d is None:
            lines.append(f"| {label} ms | – | – | – | – | – | 0 |")
        else:
            cells = " | ".join(_fmt(d[k]) for k in (*PERCENTILES, "mean"))
            lines.append(f"| {label} ms | {cells} | {d['count']} |")
    lines += [
        "",
        f"- requests: {sm['num_requests']} ({sm['num_requests_without_output']} without "
        f"output); prompt tokens {sm['total_prompt_tokens']}, output tokens "
        f"{sm['total_output_tokens']}, wall {sm['wall_s']:.3f} s",
        f"- output tokens/s: {_fmt(sm['output_tokens_per_s'])}"
        + (f"; {DecodeBandwidth.from_dict(bw).describe()} at TPOT p50" if (bw := s.get("decode_bandwidth")) else ""),
        f"- decode batch size: peak {_opt(sm['peak_decode_batch_size'])}, mean {_fmt(sm['mean_decode_batch_size'])}",
        f"- KV blocks: peak used {_opt(sm['peak_kv_blocks_used'])} of "
        f"{_opt(sm['num_kv_blocks'])}; in use at end {_opt(sm['kv_blocks_in_use_at_end'])} "
        f"(leak check: {_pass(sm['kv_leak_free'])})",
        f"- peak resident memory: {_fmt_bytes(sm['peak_rss_bytes'])}",
        "",
    ]
    return lines + _budgets_markdown(s["budgets"])


def _budgets_markdown(budgets: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md lines of one scenario's budget table."""
    if not budgets:
        return ["No budgets for this scenario.", ""]
    lines = ["| budget | limit | measured | margin | result |", "|---|---:|---:|---:|---|"]
    for b in budgets:
        label = b["metric"] + ("" if b["percentile"] is None else f" {b['percentile']}")
        op = "≤" if b["kind"] == "max" else "≥"
        if b["passed"]:
            result = "PASS"
        else:  # a no-data failure says why; a measured one speaks for itself
            result = f"FAIL ({b['reason']})" if b["measured"] is None else "FAIL"
        lines.append(
            f"| {label} | {op} {b['limit']:g} {b['unit']} | {_fmt(b['measured'])} | "
            f"{fmt_margin(b['margin'])} | {result} |"
        )
    return lines + [""]


# -- Writing ------------------------------------------------------------------------------------

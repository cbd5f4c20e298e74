"""What ``trtpipe validate`` prints: the latency table, the run facts, the budget table and the gate
line (rich markup; the tables go to stderr when stdout carries ``--json``).

The gate is computed once, from the scenario reports and the correctness verdict
(:func:`gate_of_reports`, the rule of :class:`trtpipe.runtime.measure.budgets.Gate`), and printed as is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from trtpipe.runtime.measure.budgets import Gate


def validate_consoles(as_json: bool) -> tuple[Any, Any]:
    """``(out, err)`` rich consoles of ``validate``: tables on stdout (stderr when stdout carries
    JSON), progress on stderr. Off a terminal (a CI log, a pipe) they are 160 columns wide: at
    rich's default 80 a summary line or a fix was split mid-sentence."""
    from rich.console import Console

    consoles = Console(stderr=as_json, highlight=False), Console(stderr=True, highlight=False)
    for c in consoles:
        if not c.is_terminal:
            c.width = 160
    return consoles


def gate_of_reports(reports: Sequence[Any], correctness_passed: bool | None) -> Gate:
    """The gate over every scenario's budget rows, ``correctness_passed`` (None: not checked) and the
    KV leak check (None when no scenario ran it). ``reports``: :class:`~trtpipe.runtime.measure.report.document.ScenarioReport`."""
    leaks = [r.summary.kv_leak_free for r in reports if r.summary.kv_leak_free is not None]
    results = [b for r in reports for b in r.budget_results]
    return Gate.of(results, correctness_passed, all(leaks) if leaks else None)


def _metrics_table(name: str, summary: Any):
    from rich.table import Table

    from trtpipe.runtime.metrics.request_metrics import LATENCY_METRICS, PERCENTILES

    t = Table(title=f"scenario {name}: latency (ms)", title_justify="left")
    t.add_column("metric")
    for p in (*PERCENTILES, "mean"):
        t.add_column(p, justify="right")
    t.add_column("n", justify="right")
    labels = {
        "ttft": "TTFT (from arrival)",
        "tpot": "TPOT",
        "itl": "ITL",
        "e2e": "E2E",
        "prefill": "prefill only",
        "queue": "queue",
    }
    for m in LATENCY_METRICS:
        d = getattr(summary, m)
        if d is None:
            t.add_row(labels[m], *["–"] * 5, "0")
        else:
            t.add_row(labels[m], *(f"{d.get(p) * 1e3:.1f}" for p in (*PERCENTILES, "mean")), str(d.count))
    return t


def _summary_line(s: Any) -> str:
    def opt(x, fmt="{}"):
        return "–" if x is None else fmt.format(x)

    leak = {None: "not checked", True: "[green]all free[/green]", False: "[red]LEAK[/red]"}[s.kv_leak_free]
    return (
        f"  output {opt(s.output_tokens_per_s, '{:.1f}')} tokens/s over {s.wall_s:.2f} s; decode "
        f"batch peak {opt(s.peak_decode_batch_size)} mean {opt(s.mean_decode_batch_size, '{:.2f}')}; "
        f"KV blocks peak {opt(s.peak_kv_blocks_used)}/{opt(s.num_kv_blocks)}, at end "
        f"{opt(s.kv_blocks_in_use_at_end)} ({leak}); peak RSS "
        f"{opt(s.peak_rss_bytes and s.peak_rss_bytes / 2**20, '{:.0f}')} MiB; prefix cache "
        f"{s.prefix_cache_hits_tokens}/{s.total_prompt_tokens} prompt tokens hit"
    ) + _first_token_path_line(s)


def _first_token_path_line(s: Any) -> str:
    """validate --url: the server's mean ms per stage to the first token chunk, and the sum."""
    if not s.server_first_token_path_ms:
        return ""
    stages = ", ".join(f"{name} {ms:.2f}" for name, ms in s.server_first_token_path_ms)
    total = sum(ms for _, ms in s.server_first_token_path_ms)
    return f"\n  server's first-token path, mean ms: {stages} (sum {total:.1f})"


def print_scenario(out: Any, rep: Any) -> None:
    """The latency table, the run facts and the budget table (measured, limit, margin, result)."""
    from trtpipe.runtime.measure.report.document import render_rich_table

    out.print(_metrics_table(rep.name, rep.summary))
    out.print(_summary_line(rep.summary))
    if rep.budget_results:
        out.print(render_rich_table(rep.budget_results, title=f"scenario {rep.name}: budgets"))
    else:
        out.print(f"  scenario {rep.name}: no budgets")


def finish_report(
    out: Any, err: Any, paths: Any, gate: Gate, as_json: bool, then: Callable[[], None] | None = None
) -> int:
    """Print the gate line and where the report went; run ``then`` (e.g. the goodput search);
    print report.json on stdout with ``as_json``. Returns the gate's exit code."""
    word = {None: "not run", True: "pass", False: "[red]FAIL[/red]"}
    verdict = "[green]PASS[/green]" if gate.passed else "[red]FAIL[/red]"
    out.print(
        f"gate: {verdict} (exit {gate.exit_code}): budgets {word[gate.budgets_passed]}, "
        f"correctness {word[gate.correctness_passed]}, KV leak check {word[gate.kv_leak_free]}"
    )
    out.print(f"report: {paths.report_json} (+ report.md and {len(paths.plots())} plots in {paths.report_json.parent})")
    if paths.notice:
        err.print(paths.notice, markup=False)  # "[plots]" in the notice is text, not rich markup
    if then is not None:
        then()
    if as_json:
        sys.stdout.write(paths.report_json.read_text(encoding="utf-8"))
        sys.stdout.flush()
    return gate.exit_code

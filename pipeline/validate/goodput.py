"""``trtpipe validate --goodput``: per Poisson scenario, the highest arrival rate whose budgets
hold (:func:`trtpipe.runtime.measure.goodput.find_goodput` over runs of the scenario), with a plot of the
budgeted latency percentiles against the rate.

A :class:`ProbeRunner` says how one run goes: in-process (``LLM``, :func:`in_process_runner`) or
over HTTP against ``trtpipe serve`` (``validate --url/--serve``, :func:`http_runner`); the search,
the budgets and the files written are the same."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ProbeRunner:
    """How a probe runs a workload: ``tokenizer`` and ``chat_template`` build its items
    (``make_workload``), ``run(items)`` runs them open-loop and returns ``run_workload``'s
    (metrics, wall seconds, step stats)."""

    tokenizer: Any
    chat_template: str | None
    run: Callable[[Sequence[Any]], tuple[Any, float, Any]]


def in_process_runner(llm: Any) -> ProbeRunner:
    from trtpipe.runtime.measure.workload import run_workload

    return ProbeRunner(llm.tokenizer, llm.manifest.model.chat_template, lambda items: run_workload(llm, items, None))


def http_runner(
    url: str, model: str, tokenizer: Any, chat_template: str | None, api_key: str | None = None
) -> ProbeRunner:
    """Probes against a running ``trtpipe serve`` (timed at the client, as ``validate --url``)."""
    from trtpipe.runtime.measure.http_client import run_workload_http

    return ProbeRunner(
        tokenizer, chat_template, lambda items: run_workload_http(url, model, items, None, api_key=api_key)
    )


def _probe_fn(runner: ProbeRunner, scenario: Any, spec: Any, err: Any):
    from trtpipe.runtime.measure.budgets import evaluate_budgets
    from trtpipe.runtime.measure.goodput import ProbeResult
    from trtpipe.runtime.measure.workload import make_workload
    from trtpipe.runtime.metrics.request_metrics import summarize

    budgets = scenario.budgets.runtime_budgets()
    probe_ids = itertools.count()

    def probe(rate: float) -> ProbeResult:
        t = time.perf_counter()
        # The scenario's warm-up requests run first, unmeasured, as in the gate run: they warm the
        # engine and seed this probe's cache with the prefix every request shares (a server in
        # service has it); without them one cold request is the p95 of a 16-request probe.
        s = dataclasses.replace(spec, arrival_rate_per_s=rate)
        # Each probe its own prefix-cache salt: the search repeats the same prompts at every rate,
        # and a probe must not hit the blocks an earlier probe left (it would measure whole
        # prompts cached, which no new traffic gets); shared prefixes within a probe still hit.
        salt = f"goodput-probe-{next(probe_ids)}"
        items = [
            dataclasses.replace(it, cache_salt=salt)
            for it in make_workload(s, runner.tokenizer, chat_template=runner.chat_template)
        ]
        metrics, wall_s, stats = runner.run(items)
        summary = summarize(metrics, wall_s, stats)
        results = evaluate_budgets(summary, budgets)
        passed = all(r.passed for r in results)
        lat = {f"{r.metric}_{r.percentile}": r.measured for r in results if r.percentile}
        shown = ", ".join(f"{k} {v:.0f}" for k, v in lat.items() if v is not None)
        err.print(
            f"  {scenario.name} at {rate:.3g} req/s: {'pass' if passed else 'fail'} ({shown}) "
            f"in {time.perf_counter() - t:.0f} s"
        )
        return ProbeResult(rate, passed, summary.output_tokens_per_s, lat, time.perf_counter() - t)

    return probe


def plot_goodput(results: Sequence[Any], limits: dict[str, list[tuple[str, str, float]]]) -> bytes:
    """PNG: each scenario's budgeted percentiles (ms) against the probed rate, budgets dashed."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5 * max(1, len(results)), 3.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        probes = sorted(res.probes, key=lambda p: p.rate_per_s)
        for metric, pct, limit in limits.get(res.scenario, []):
            key = f"{metric}_{pct}"
            pts = [(p.rate_per_s, p.latency_ms.get(key)) for p in probes if p.latency_ms.get(key) is not None]
            line = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=key)[0]
            ax.axhline(limit, linestyle="--", color=line.get_color(), linewidth=1)
        if res.goodput_per_s:
            ax.axvline(res.goodput_per_s, color="green", linewidth=1, label="goodput")
        ax.set_title(f"{res.scenario}: goodput {res.goodput_per_s or 0:.3g} req/s")
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def run_goodput(
    runner: ProbeRunner,
    chosen: Sequence[tuple[Any, Any]],
    out_dir: Path,
    err: Any,
    out: Any,
    *,
    time_budget_s: float,
    max_probes: int = 8,
    before_each=None,
) -> list[Any]:
    """Search each Poisson scenario's goodput (``time_budget_s`` per scenario); write
    ``goodput.json`` and ``goodput.png`` into ``out_dir``; print a table. Closed-loop scenarios
    (``concurrency``) have no arrival rate to search and are skipped, with a note.
    ``before_each(scenario)`` runs before a scenario's search (e.g. to set its TPOT budget)."""
    from trtpipe.runtime.artifact.manifest import atomic_write_text
    from trtpipe.runtime.measure.goodput import find_goodput
    from trtpipe.runtime.measure.report.document import atomic_write_bytes

    results, limits = [], {}
    for scenario, spec in chosen:
        if spec.arrival_rate_per_s is None:
            err.print(
                f"goodput: scenario {scenario.name} is closed-loop (concurrency "
                f"{spec.concurrency}): no arrival rate to search, skipped"
            )
            continue
        if not scenario.budgets.limits():
            err.print(f"goodput: scenario {scenario.name} has no latency budget, skipped")
            continue
        if before_each is not None:
            before_each(scenario)
        err.print(
            f"goodput: scenario {scenario.name}, from {spec.arrival_rate_per_s:g} req/s, at most "
            f"{max_probes} runs / {time_budget_s:.0f} s"
        )
        res = find_goodput(
            scenario.name,
            _probe_fn(runner, scenario, spec, err),
            spec.arrival_rate_per_s,
            max_probes=max_probes,
            time_budget_s=time_budget_s,
        )
        results.append(res)
        limits[scenario.name] = [(m, p, v) for m, p, v in scenario.budgets.limits()]
        tok = f"{res.output_tokens_per_s:.1f}" if res.output_tokens_per_s else "-"
        out.print(
            f"goodput {scenario.name}: {res.goodput_per_s or 0:.3g} req/s ({tok} output tokens/s) "
            f"within its budgets; bracket {res.bracket}, stopped: {res.stopped}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "goodput.json", json.dumps([r.to_dict() for r in results], indent=2))
    if results:
        atomic_write_bytes(out_dir / "goodput.png", plot_goodput(results, limits))
    return results


__all__ = ["ProbeRunner", "http_runner", "in_process_runner", "plot_goodput", "run_goodput"]

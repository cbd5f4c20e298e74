"""One validate scenario: its workload run (in process, or over HTTP for ``validate --url``),
summarized and gated on its budgets, with a progress bar on a terminal.

    Scenario + WorkloadSpec ─► make_workload ─► run (run_workload or the HTTP runner)
      ─► summarize ─► evaluate_budgets ─► ScenarioReport
"""

from __future__ import annotations

import time
from typing import Any

from trtpipe.pipeline.recipe import Scenario


def _describe(spec) -> str:
    def rng(lo_hi):
        lo, hi = lo_hi
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    arrivals = (
        f"Poisson {spec.arrival_rate_per_s:g} req/s"
        if spec.arrival_rate_per_s is not None
        else f"closed loop, concurrency {spec.concurrency}"
    )
    prompts = (
        f"{len(spec.prompts)} prompts from a file"
        if spec.prompts is not None
        else f"prompts {rng(spec.prompt_tokens)} tokens"
    )
    return (
        f"{spec.num_warmup_requests} warm-up + {spec.num_requests} measured requests, {arrivals}, "
        f"{prompts}, outputs {rng(spec.output_tokens)} tokens, seed {spec.seed}"
    )


def run_scenario(
    llm: Any,
    scenario: Scenario,
    spec: Any,
    err: Any,
    run: Any = None,
    tokenizer: Any = None,
    chat_template: str | None = None,
    probe: Any = None,
    after_workload: Any = None,
):
    """Run one scenario's workload (progress on ``err``); its :class:`ScenarioReport`.

    ``run(items, concurrency, on_request_done)`` replaces the in-process ``run_workload(llm, ...)``
    (``validate --url`` passes the HTTP runner), ``tokenizer`` the LLM's (same return shapes) and
    ``chat_template`` the manifest's (for ``chat`` workloads; ``llm`` None). ``probe(short_ids,
    long_ids, cancel=, itl=)`` measures the engine budgets (``cancel_ms``, ``itl_during_prefill_ratio``)
    after the workload; None: in process on ``llm`` (:func:`in_process_probe`). ``after_workload()``,
    when given, is called once the workload ends and before the probes run (what it reads of
    ``llm``'s counters is the workload's alone).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtpipe.runtime.measure.budgets import evaluate_budgets
    from trtpipe.runtime.measure.report.records import ScenarioReport
    from trtpipe.runtime.measure.workload import make_workload, run_workload
    from trtpipe.runtime.metrics.request_metrics import summarize

    err.print(f"scenario {scenario.name}: {_describe(spec)}")
    items = make_workload(
        spec,
        tokenizer or llm.tokenizer,
        chat_template=chat_template if llm is None else llm.manifest.model.chat_template,
    )
    run = run or (
        lambda items, concurrency, on_request_done: run_workload(
            llm, items, concurrency, on_request_done=on_request_done
        )
    )
    t = time.perf_counter()
    with Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(f"{scenario.name} (after {spec.num_warmup_requests} warm-up)", total=spec.num_requests)
        metrics, wall_s, stats = run(items, spec.concurrency, lambda done, total: bar.update(task, completed=done))
    if after_workload is not None:
        after_workload()
    summary = summarize(metrics, wall_s, stats)
    results = evaluate_budgets(summary, scenario.budgets.runtime_budgets())
    results += _probe_results(scenario, items, probe, llm, err)
    err.print(f"  done in {time.perf_counter() - t:.1f} s")
    return ScenarioReport(scenario.name, summary, tuple(results), tuple(metrics))


PROBE_SHORT_PROMPT_TOKENS = 32  # the decoding (and cancelled) probe requests' prompt


def in_process_probe(llm: Any) -> Any:
    """The engine probes (:mod:`trtpipe.runtime.measure.engine_probes`) on ``llm``'s own engine thread."""
    from trtpipe.runtime.measure.probe_clients import InProcessProbeClient, measure_engine_probes

    limits = llm.manifest.limits

    def probe(short_ids, long_ids, *, cancel: bool, itl: bool):
        make = lambda: InProcessProbeClient(llm)  # noqa: E731 - built inside the probe's event loop
        return measure_engine_probes(
            make, short_ids, long_ids, limits.max_batch_size, limits.max_seq_len, cancel=cancel, itl=itl
        )

    return probe


def _probe_results(scenario: Scenario, items: Any, probe: Any, llm: Any, err: Any) -> list:
    """The scenario's engine budgets measured by ``probe`` with its workload's shortest and longest
    prompts ([] when it sets none); one summary line on ``err``."""
    from trtpipe.runtime.measure.budgets import evaluate_probe_budgets
    from trtpipe.runtime.metrics.request_metrics import percentile

    budgets = scenario.budgets.engine_budgets()
    if not budgets:
        return []
    prompts = sorted((it.prompt_ids for it in items if not it.warmup), key=len)
    short, long = list(prompts[0][:PROBE_SHORT_PROMPT_TOKENS]), list(prompts[-1])
    kinds = {b.metric for b in budgets}
    probe = probe or in_process_probe(llm)
    res = probe(short, long, cancel="cancel_ms" in kinds, itl="itl_during_prefill_ratio" in kinds)

    def p95(xs) -> str:
        return f"{percentile(xs, 95):.1f} ms" if xs else "none"

    def p50(xs) -> str:
        return f"{percentile(xs, 50):.0f} ms" if xs else "none"

    err.print(
        f"  engine probes: cancel -> KV free p95 {p95(res.cancel_ms)} ({len(res.cancel_ms)} cancels at saturation); "
        f"ITL p95 steady {p95(res.itl_steady_ms)}, during a {len(long)}-token partner prefill "
        f"{p95(res.itl_during_prefill_ms)} (the partners' TTFT p50 {p50(res.partner_ttft_ms)})",
        markup=False,
    )
    return evaluate_probe_budgets(res, budgets)


__all__ = ["in_process_probe", "run_scenario"]

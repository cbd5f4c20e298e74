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
):
    """Run one scenario's workload (progress on ``err``); its :class:`ScenarioReport`.

    ``run(items, concurrency, on_request_done)`` replaces the in-process ``run_workload(llm, ...)``
    (``validate --url`` passes the HTTP runner), ``tokenizer`` the LLM's (same return shapes) and
    ``chat_template`` the manifest's (for ``chat`` workloads; ``llm`` None).
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
    summary = summarize(metrics, wall_s, stats)
    results = evaluate_budgets(summary, scenario.budgets.runtime_budgets())
    err.print(f"  done in {time.perf_counter() - t:.1f} s")
    return ScenarioReport(scenario.name, summary, tuple(results), tuple(metrics))


__all__ = ["run_scenario"]

"""Prefix caching and the slo chunk policy, measured in one process, interleaved.

    .venv/bin/python bench/prefix_slo.py [--reps 2] [--tpot-budget-ms 50] [--itl-budget-ms 100]
                                         [--skip-assistant] [--remeasure-cost]

One LLM on the default artifact; per repetition, in this order:
  assistant scenario (256-token shared system prompt): prefix caching on, then off
      -> TTFT p95 ratio (on / off); the cache is reset before every run, so each "on" run
         starts cold (its warm-up request seeds the system prompt, as a server's first user does)
  summary scenario (448-512-token prompts, 2 clients): slo policy at the TPOT budget (and the
      ITL budget, which lets steps spend TPOT slack; 0 = none), then fcfs
      -> ITL p99 (the prefill stall) under each, TTFT p50 ratio (slo / fcfs)
  chat scenario at --chat-rate req/s: the server's default (slo, budgets derived as
      `trtpipe serve` derives them), then fcfs -> goodput ratio (TTFT <= 200 ms, TPOT <= 50 ms)
and the issue-27 targets, each met or not (summary["targets"]).
and the step-cost model's prediction error over every step the slo runs scheduled (relative
|predicted - measured| / measured: p50, p90). Prints the 1-minute load average before and after
each run: on a shared machine only same-run ratios mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tpot-budget-ms", type=float, default=50.0)
    ap.add_argument("--itl-budget-ms", type=float, default=100.0, help="0 = no ITL budget")
    ap.add_argument("--skip-assistant", action="store_true", help="only the summary runs")
    ap.add_argument(
        "--chat-rate", type=float, default=2.0, help="chat's Poisson rate for its goodput pair (req/s; 0 = skip)"
    )
    ap.add_argument("--artifact", default=str(ROOT / "artifacts" / "smollm2-135m-cpu" / "cpu"))
    ap.add_argument("--remeasure-cost", action="store_true", help="delete step_cost.json first")
    ap.add_argument("--json", dest="json_out", default=None, help="also write the results here")
    return ap


def run_scenario(llm, recipe, scenario_name: str, rate: float | None = None) -> dict:
    """One run of a recipe scenario on ``llm`` (``rate``: its Poisson rate instead of the recipe's):
    its TTFT/ITL/TPOT percentiles (ms), prefix-cache hits, goodput (requests with TTFT <= 200 ms
    and TPOT <= 50 ms per second, the issue-27 SLO), wall time and the 1-minute load average."""
    import dataclasses

    from trtpipe.pipeline.validate.runner import scenario_workload_spec
    from trtpipe.runtime.measure.workload import make_workload, run_workload
    from trtpipe.runtime.metrics.request_metrics import summarize

    spec = scenario_workload_spec(recipe, recipe.validation.scenario(scenario_name))
    if rate is not None:
        spec = dataclasses.replace(spec, arrival_rate_per_s=rate, concurrency=None)
    items = make_workload(spec, llm.tokenizer, chat_template=llm.manifest.model.chat_template)
    load0 = os.getloadavg()[0]
    metrics, wall_s, stats = run_workload(llm, items, spec.concurrency)
    s = summarize(metrics, wall_s, stats)
    return {
        "ttft_p50_ms": s.latency_ms("ttft", "p50"),
        "ttft_p95_ms": s.latency_ms("ttft", "p95"),
        "itl_p99_ms": s.latency_ms("itl", "p99"),
        "itl_p50_ms": s.latency_ms("itl", "p50"),
        "tpot_p95_ms": s.latency_ms("tpot", "p95"),
        "cached_tokens": s.prefix_cache_hits_tokens,
        "goodput_rps": round(sum(_good(m) for m in metrics) / wall_s, 3),
        "prompt_tokens": s.total_prompt_tokens,
        "wall_s": round(wall_s, 1),
        "load_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
    }


def _good(m) -> bool:
    """Meets the issue-27 SLO: TTFT <= 200 ms and TPOT <= 50 ms (no TPOT with one output token)."""
    return m.ttft_s is not None and m.ttft_s <= 0.2 and (m.tpot_s is None or m.tpot_s <= 0.05)


def run_chat(llm, recipe, rate: float, results: dict, rep: int) -> None:
    """chat at ``rate`` req/s under the server's default (slo with the derived budgets), then fcfs."""
    from trtpipe.runtime.sched.serving_budgets import derive_serving_budgets

    limits = llm.manifest.limits
    derived = derive_serving_budgets(
        llm.step_cost_model(), limits.max_batch_size, limits.max_seq_len, llm.kv_manager.block_size
    )
    for policy in ("slo", "fcfs"):
        llm.block_pool.reset_prefix_cache()
        llm.scheduler_policy = policy
        llm.set_tpot_budget(derived.tpot_budget_ms, derived.itl_budget_ms)
        r = run_scenario(llm, recipe, "chat", rate)
        results.setdefault(f"chat_{policy}", []).append(r)
        print(f"rep {rep} chat {policy} at {rate:g} req/s ({derived.why}): {r}", flush=True)
    llm.scheduler_policy = "slo"


def run_reps(
    llm,
    recipe,
    reps: int,
    tpot_budget_ms: float,
    itl_budget_ms: float | None,
    skip_assistant: bool = False,
    chat_rate: float = 0.0,
) -> tuple[dict[str, list[dict]], list[float]]:
    """``reps`` interleaved repetitions (assistant: cache on, off; summary: slo, fcfs); returns the
    runs by name and the step-cost model's relative errors over the slo runs' steps."""
    results: dict[str, list[dict]] = {
        "assistant_cache_on": [],
        "assistant_cache_off": [],
        "summary_slo": [],
        "summary_fcfs": [],
    }
    errors: list[float] = []
    for rep in range(reps):
        for on in () if skip_assistant else (True, False):
            llm.set_tpot_budget(None)
            llm.scheduler.prefix_cache.enabled = on
            llm.block_pool.reset_prefix_cache()
            r = run_scenario(llm, recipe, "assistant")
            results[f"assistant_cache_{'on' if on else 'off'}"].append(r)
            print(f"rep {rep} assistant cache {'on ' if on else 'off'}: {r}", flush=True)
        llm.scheduler.prefix_cache.enabled = True
        for policy in ("slo", "fcfs"):
            llm.block_pool.reset_prefix_cache()
            llm.scheduler_policy = policy
            why = llm.set_tpot_budget(tpot_budget_ms, itl_budget_ms)
            llm.step_cost_log.clear()
            r = run_scenario(llm, recipe, "summary")
            if policy == "slo":
                errors += [
                    abs(s.predicted_s - s.measured_s) / s.measured_s for s in llm.step_cost_log if s.measured_s > 0
                ]
            results[f"summary_{policy}"].append(r)
            print(f"rep {rep} summary {policy}: {r}\n    chunking: {why}", flush=True)
        if chat_rate:
            run_chat(llm, recipe, chat_rate, results, rep)
        llm.scheduler_policy = "slo"
    return results, sorted(errors)


def summarize_reps(results: dict[str, list[dict]], errors: list[float], cost) -> dict:
    """Medians over the repetitions: the ratios the docstring names, and the cost model's error."""

    def med(key: str, field: str) -> float:
        vals = [r[field] for r in results[key]]
        return statistics.median(vals) if vals else float("nan")  # nan: not run (--skip-assistant)

    return {
        "assistant_ttft_p95_ms_on_off": [
            med("assistant_cache_on", "ttft_p95_ms"),
            med("assistant_cache_off", "ttft_p95_ms"),
        ],
        "assistant_ttft_p95_ratio_on_over_off": med("assistant_cache_on", "ttft_p95_ms")
        / med("assistant_cache_off", "ttft_p95_ms"),
        "summary_itl_p99_ms_slo_fcfs": [med("summary_slo", "itl_p99_ms"), med("summary_fcfs", "itl_p99_ms")],
        "summary_tpot_p95_ms_slo_fcfs": [med("summary_slo", "tpot_p95_ms"), med("summary_fcfs", "tpot_p95_ms")],
        "summary_ttft_p50_ratio_slo_over_fcfs": med("summary_slo", "ttft_p50_ms") / med("summary_fcfs", "ttft_p50_ms"),
        "cost_model_rel_error_p50_p90": [errors[len(errors) // 2], errors[int(0.9 * (len(errors) - 1))]]
        if errors
        else None,
        "cost_model_stated_error_ms": cost.error_ms,
        "num_steps_compared": len(errors),
        "chat_goodput_rps_slo_fcfs": [med("chat_slo", "goodput_rps"), med("chat_fcfs", "goodput_rps")],
        "chat_goodput_ratio_slo_over_fcfs": med("chat_slo", "goodput_rps") / max(1e-9, med("chat_fcfs", "goodput_rps")),
    }


def targets(s: dict) -> dict:
    """The issue-27 restated targets, each met or not."""
    return {
        "summary ITL p99 <= 100 ms under slo": s["summary_itl_p99_ms_slo_fcfs"][0] <= 100,
        "summary TTFT p50 <= 1.25x fcfs": s["summary_ttft_p50_ratio_slo_over_fcfs"] <= 1.25,
        "assistant TTFT p95 with the cache <= 0.5x without": s["assistant_ttft_p95_ratio_on_over_off"] <= 0.5,
        "chat goodput >= 0.95x fcfs": s["chat_goodput_ratio_slo_over_fcfs"] >= 0.95,
    }


def main() -> int:
    args = _parser().parse_args()
    from trtpipe.pipeline.recipe import load_recipe
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.sched.step_cost import STEP_COST_FILE

    if args.remeasure_cost:
        (Path(args.artifact) / STEP_COST_FILE).unlink(missing_ok=True)
    recipe = load_recipe(ROOT / "recipes" / "smollm2-135m-cpu.yaml")
    llm = LLM(args.artifact, scheduler_policy="slo")
    t = time.perf_counter()
    cost = llm.step_cost_model()
    print(f"step-cost model ({time.perf_counter() - t:.1f} s): {json.dumps(json.loads(cost.to_json()))}")
    results, errors = run_reps(
        llm, recipe, args.reps, args.tpot_budget_ms, args.itl_budget_ms or None, args.skip_assistant, args.chat_rate
    )
    summary = summarize_reps(results, errors, cost)
    summary["targets"] = targets(summary)
    print(json.dumps(summary, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

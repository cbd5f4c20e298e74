"""The scheduler budgets a server runs with when neither the recipe nor the command line gives one.

A server sees every kind of traffic at once, so no one validate scenario's budget applies; without
any budget the ``slo`` policy would prefill FCFS (whole prompts per step), and one long prompt
stalls every decoding stream for its whole prefill (issue 27: ITL p99 215 ms at 1 req/s). So
``trtpipe serve`` keeps the interactive SLO of the seed article and of vLLM's benchmark goodput
(TPOT <= 50 ms, and ITL <= 2x that) when the engine can hold it, and raises it just enough when it
cannot, from the engine's measured step-cost model (:mod:`trtpipe.runtime.sched.step_cost`)::

    context        = 512 tokens per sequence (less when max_seq_len is shorter)
    min_mixed_ms   = cost.step_time_s([(block_size, context)], max_batch_size, max_batch_size x context)
                     the smallest step that decodes a full batch and still advances a prompt (one block)
    step cap       = ITL_BUDGET_MARGIN (0.8) x ITL budget       (the slo policy's longest planned step)
    tpot_budget_ms = max(INTERACTIVE_TPOT_MS, min_mixed_ms / (0.8 x ITL_OVER_TPOT))
    itl_budget_ms  = ITL_OVER_TPOT x tpot_budget_ms

so the smallest mixed step at a full batch always fits the step cap: a waiting prompt is never
starved by a full decode batch, and the SLO is not raised when it is already holdable (TPOT is a
mean: decode-only steps shorter than the budget leave slack for the mixed ones). The start line says
which (never a budget that every step would break); the ``slo`` policy
(:mod:`trtpipe.runtime.sched.slo_policy`) then sizes every step's prefill chunk from these budgets:
stall-free chunked prefill, every running decode in every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.sched.slo_policy import ITL_BUDGET_MARGIN
from trtpipe.runtime.sched.step_cost import StepCostModel

INTERACTIVE_TPOT_MS = 50.0  # seed article (summary TPOT p95) and vLLM bench serve's goodput TPOT
ITL_OVER_TPOT = 2.0  # the longest gap a streaming client accepts: 2x the mean (ITL p99 <= 100 ms)
REFERENCE_CONTEXT_TOKENS = 512  # context per sequence of the "full decode batch"


@dataclass(frozen=True)
class ServingBudgets:
    """The ``slo`` policy's budgets for a server [ms] and where they came from (``source``:
    ``given`` or ``derived``; ``why``: one line for the start line)."""

    tpot_budget_ms: float
    itl_budget_ms: float | None
    source: str
    why: str


def derive_serving_budgets(
    cost: StepCostModel, max_batch_size: int, max_seq_len: int, block_size: int
) -> ServingBudgets:
    """The derived pair (module doc) for an engine with step-cost model ``cost``; sizes in tokens
    and sequences (>= 1)."""
    context = min(REFERENCE_CONTEXT_TOKENS, max(1, max_seq_len // 2))
    chunk = min(block_size, max(1, max_seq_len - context))
    min_mixed_ms = cost.step_time_s([(chunk, context)], max_batch_size, max_batch_size * context) * 1e3
    held = min_mixed_ms / (ITL_BUDGET_MARGIN * ITL_OVER_TPOT)
    tpot = max(INTERACTIVE_TPOT_MS, held)
    fits = f"{max_batch_size} decodes x {context} tokens + a {chunk}-token chunk: {min_mixed_ms:.1f} ms"
    if tpot > INTERACTIVE_TPOT_MS:
        why = f"raised from {INTERACTIVE_TPOT_MS:g} ms so that the smallest full-batch mixed step fits the step cap ({fits})"
    else:
        why = f"the interactive SLO; the smallest full-batch mixed step fits its step cap ({fits})"
    tpot = round(tpot, 1)
    itl = round(ITL_OVER_TPOT * tpot, 1)
    return ServingBudgets(tpot, itl, "derived", f"derived: TPOT {tpot:g} ms, ITL {itl:g} ms ({why})")


def serving_budgets(
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    cost: StepCostModel,
    max_batch_size: int,
    max_seq_len: int,
    block_size: int,
) -> ServingBudgets:
    """The budgets given (recipe or flags: either one given counts, the slo policy fills in the
    other, see :meth:`~trtpipe.runtime.llm.LLM.set_tpot_budget`), else :func:`derive_serving_budgets`."""
    if tpot_budget_ms is not None or itl_budget_ms is not None:
        tpot = tpot_budget_ms if tpot_budget_ms is not None else itl_budget_ms
        assert tpot is not None
        return ServingBudgets(float(tpot), itl_budget_ms, "given", "given by the recipe or the flags")
    return derive_serving_budgets(cost, max_batch_size, max_seq_len, block_size)


__all__ = [
    "INTERACTIVE_TPOT_MS",
    "ITL_OVER_TPOT",
    "REFERENCE_CONTEXT_TOKENS",
    "ServingBudgets",
    "derive_serving_budgets",
    "serving_budgets",
]

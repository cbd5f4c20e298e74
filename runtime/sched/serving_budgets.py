"""The scheduler budgets a server runs with when neither the recipe nor the command line gives one.

A server sees every kind of traffic at once, so no one validate scenario's budget applies; without
any budget the ``slo`` policy would prefill FCFS (whole prompts per step), and one long prompt
stalls every decoding stream for its whole prefill (issue 27: ITL p99 215 ms at 1 req/s). So
``trtpipe serve`` derives a pair from the interactive SLO of the seed article and vLLM's
benchmark goodput (TPOT <= 50 ms) and from the engine's measured step-cost model
(:mod:`trtpipe.runtime.sched.step_cost`)::

    full_decode_ms = cost.decode_time_s(max_batch_size, max_batch_size * context)   context: 512
                                                              tokens (less when max_seq_len is shorter)
    tpot_budget_ms = max(INTERACTIVE_TPOT_MS, DECODE_HEADROOM x full_decode_ms)
    itl_budget_ms  = ITL_OVER_TPOT x tpot_budget_ms

``DECODE_HEADROOM`` = 2: a step that decodes a full batch must still carry a prefill chunk of
several blocks, or a waiting prompt advances by one block per step and its TTFT grows with the
decode batch. An engine whose full decode batch fits half the interactive TPOT keeps 50 ms; a
slower one gets a budget it can hold (said on the start line: never a budget that every step
would break). The ``slo`` policy (:mod:`trtpipe.runtime.sched.slo_policy`) then sizes every
step's prefill chunk from these budgets: stall-free chunked prefill, every running decode in
every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.runtime.sched.step_cost import StepCostModel

INTERACTIVE_TPOT_MS = 50.0  # seed article (summary TPOT p95) and vLLM bench serve's goodput TPOT
ITL_OVER_TPOT = 2.0  # the longest gap a streaming client accepts: 2x the mean (ITL p99 <= 100 ms)
DECODE_HEADROOM = 2.0  # the budget holds a full decode batch plus as much again for prefill
REFERENCE_CONTEXT_TOKENS = 512  # context per sequence of the "full decode batch"


@dataclass(frozen=True)
class ServingBudgets:
    """The ``slo`` policy's budgets for a server [ms] and where they came from (``source``:
    ``given`` or ``derived``; ``why``: one line for the start line)."""

    tpot_budget_ms: float
    itl_budget_ms: float | None
    source: str
    why: str


def derive_serving_budgets(cost: StepCostModel, max_batch_size: int, max_seq_len: int) -> ServingBudgets:
    """The derived pair (module doc) for an engine with step-cost model ``cost``; sizes in tokens
    and sequences (>= 1)."""
    context = min(REFERENCE_CONTEXT_TOKENS, max(1, max_seq_len // 2))
    full_decode_ms = cost.decode_time_s(max_batch_size, max_batch_size * context) * 1e3
    held = DECODE_HEADROOM * full_decode_ms
    tpot = max(INTERACTIVE_TPOT_MS, held)
    raised = (
        f"raised from {INTERACTIVE_TPOT_MS:g} ms to {DECODE_HEADROOM:g}x the predicted full decode batch"
        if tpot > INTERACTIVE_TPOT_MS
        else f"the interactive SLO; a full decode batch is predicted at {full_decode_ms:.1f} ms <= 1/{DECODE_HEADROOM:g} of it"
    )
    why = (
        f"derived: TPOT {tpot:.0f} ms ({raised}; {max_batch_size} sequences x {context} tokens: "
        f"{full_decode_ms:.1f} ms), ITL {ITL_OVER_TPOT:g}x = {ITL_OVER_TPOT * tpot:.0f} ms"
    )
    return ServingBudgets(round(tpot, 1), round(ITL_OVER_TPOT * tpot, 1), "derived", why)


def serving_budgets(
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    cost: StepCostModel,
    max_batch_size: int,
    max_seq_len: int,
) -> ServingBudgets:
    """The budgets given (recipe or flags: either one given counts, the slo policy fills in the
    other, see :meth:`~trtpipe.runtime.llm.LLM.set_tpot_budget`), else :func:`derive_serving_budgets`."""
    if tpot_budget_ms is not None or itl_budget_ms is not None:
        tpot = tpot_budget_ms if tpot_budget_ms is not None else itl_budget_ms
        assert tpot is not None
        return ServingBudgets(float(tpot), itl_budget_ms, "given", "given by the recipe or the flags")
    return derive_serving_budgets(cost, max_batch_size, max_seq_len)


__all__ = [
    "DECODE_HEADROOM",
    "INTERACTIVE_TPOT_MS",
    "ITL_OVER_TPOT",
    "REFERENCE_CONTEXT_TOKENS",
    "ServingBudgets",
    "derive_serving_budgets",
    "serving_budgets",
]

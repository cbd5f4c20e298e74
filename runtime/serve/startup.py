"""What the server does between loading the model and its ready line: choose the scheduler's
budgets, measure or load the step-cost model, and warm the engine.

    LLM loaded ─► step-cost model (step_cost.json, else measured: 3-5 s)
               ─► budgets: the recipe's / the flags', else derived (runtime/sched/serving_budgets.py)
               ─► slo policy: stall-free chunked prefill sized from them (runtime/sched/slo_policy.py)
               ─► warm-up: every decode batch and prefill chunk size, the KV pool, one request
                  (runtime/serve/warmup.py)
               ─► ready (/health 200)

Under ``--scheduler-policy fcfs`` the budgets are not used (FCFS chunks), but the step-cost model
is still loaded: the admission limit (``--max-queue-wait-ms``) predicts queue waits with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtpipe.runtime.sched.serving_budgets import ServingBudgets, serving_budgets
from trtpipe.runtime.serve.warmup import WarmUpReport, warm_up

if TYPE_CHECKING:
    from trtpipe.runtime.llm import LLM


@dataclass(frozen=True)
class Prepared:
    """The start lines' facts: the prefill chunking, the budgets (None under fcfs), the warm-up,
    and the seconds all of it took (step-cost model included)."""

    chunking: str
    budgets: ServingBudgets | None
    warm: WarmUpReport | None  # None: skipped (--no-warm-up)
    seconds: float

    def ready_detail(self) -> str:
        """For the ready line: how long the warm-up took (step-cost model included)."""
        if self.warm is None:
            return f"not warmed up (--no-warm-up; step-cost model and budgets in {self.seconds:.1f} s)"
        return f"{self.warm.line()}; with the step-cost model and budgets {self.seconds:.1f} s"


def prepare(
    llm: LLM,
    scheduler_policy: str,
    tpot_budget_ms: float | None,
    itl_budget_ms: float | None,
    itl_during_prefill_ratio: float | None = None,
    *,
    warm: bool = True,
) -> Prepared:
    """Budgets, policy and warm-up of a freshly loaded ``llm`` (module doc); the ITL-during-prefill
    ratio applies as given (:meth:`~trtpipe.runtime.llm.LLM.set_tpot_budget`). ``warm`` False skips
    the warm-up (``--no-warm-up``: to measure what it saves)."""
    t0 = time.perf_counter()
    limits = llm.manifest.limits
    cost = llm.step_cost_model()
    budgets = None
    if scheduler_policy == "slo":
        budgets = serving_budgets(
            tpot_budget_ms, itl_budget_ms, cost, limits.max_batch_size, limits.max_seq_len, llm.kv_manager.block_size
        )
        chunking = llm.set_tpot_budget(budgets.tpot_budget_ms, budgets.itl_budget_ms, itl_during_prefill_ratio)
        chunking = f"{chunking}; budgets {budgets.why}"
    else:
        chunking = llm.set_tpot_budget(tpot_budget_ms, itl_budget_ms, itl_during_prefill_ratio)
    report = warm_up(llm) if warm else None
    return Prepared(chunking, budgets, report, round(time.perf_counter() - t0, 2))


__all__ = ["Prepared", "prepare"]

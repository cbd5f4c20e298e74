"""The scheduler budgets validate runs each scenario under in process: the recipe's
``runtime.scheduler`` settings, else the scenario's own budgets (``tpot_ms``, ``itl_ms``,
``itl_during_prefill_ratio``: the scheduler aims at what the gate measures), else the budgets
``trtpipe serve`` derives (:mod:`~trtpipe.runtime.sched.serving_budgets`)."""

from __future__ import annotations

from typing import Any

from trtpipe.pipeline.recipe import Recipe, Scenario


def scenario_slo_budgets_ms(recipe: Recipe, scenario: Scenario) -> tuple[float | None, float | None]:
    """``(tpot_budget_ms, itl_budget_ms)`` the ``slo`` policy keeps in this scenario.

    ITL: ``runtime.scheduler.itl_budget_ms``, else the scenario's tightest ``itl_ms`` limit, else None
    (every step within the TPOT budget). TPOT: ``runtime.scheduler.tpot_budget_ms``, else the scenario's
    tightest ``tpot_ms`` limit, else the ITL budget (a TPOT is at most the longest gap), else None
    (FCFS)."""
    limits = scenario.budgets.limits()
    tpot = [v for m, _, v in limits if m == "tpot_ms"]
    itl = [v for m, _, v in limits if m == "itl_ms"]
    itl_ms = recipe.runtime.scheduler.itl_budget_ms
    if itl_ms is None and itl:
        itl_ms = min(itl)
    tpot_ms = recipe.runtime.scheduler.tpot_budget_ms
    if tpot_ms is None:
        tpot_ms = min(tpot) if tpot else itl_ms
    return tpot_ms, itl_ms


def scenario_itl_ratio(recipe: Recipe, scenario: Scenario) -> float | None:
    """The ITL-during-prefill ratio the ``slo`` policy keeps in this scenario:
    ``runtime.scheduler.itl_during_prefill_ratio``, else the scenario's ``itl_during_prefill_ratio``
    budget (the scheduler aims at what the gate measures, as it does with ``tpot_ms``), else None."""
    ratio = recipe.runtime.scheduler.itl_during_prefill_ratio
    return ratio if ratio is not None else scenario.budgets.itl_during_prefill_ratio


def apply_scenario_budgets(recipe: Recipe, scenario: Scenario, llm: Any) -> str:
    """Set ``llm``'s scheduler for ``scenario`` (:func:`run_budgets_ms`, :func:`scenario_itl_ratio`);
    returns its one-line description."""
    return llm.set_tpot_budget(*run_budgets_ms(recipe, scenario, llm), scenario_itl_ratio(recipe, scenario))


def run_budgets_ms(recipe: Recipe, scenario: Scenario, llm: Any) -> tuple[float | None, float | None]:
    """The budgets validate runs ``scenario`` under in process: :func:`scenario_slo_budgets_ms`, and
    when that gives none under the ``slo`` policy, the budgets ``trtpipe serve`` derives for this
    engine (:func:`~trtpipe.runtime.sched.serving_budgets.derive_serving_budgets`), so validate
    measures what the server runs."""
    from trtpipe.runtime.sched.serving_budgets import derive_serving_budgets

    tpot_ms, itl_ms = scenario_slo_budgets_ms(recipe, scenario)
    if tpot_ms is not None or recipe.runtime.scheduler.policy != "slo":
        return tpot_ms, itl_ms
    limits = llm.manifest.limits
    derived = derive_serving_budgets(
        llm.step_cost_model(), limits.max_batch_size, limits.max_seq_len, llm.kv_manager.block_size
    )
    return derived.tpot_budget_ms, derived.itl_budget_ms


__all__ = ["apply_scenario_budgets", "run_budgets_ms", "scenario_itl_ratio", "scenario_slo_budgets_ms"]

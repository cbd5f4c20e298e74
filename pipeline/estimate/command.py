"""``trtpipe estimate``: load a recipe and its model facts, estimate, join the last validate report
and the prefill-chunking notes, print (rich tables or JSON), and return the exit code.

Exit code: 0 fits and every budget is above its floor; 1 the engine does not fit in the target's
memory or a budget is below its physical floor. Recipe errors raise
:class:`~trtpipe.pipeline.recipe.RecipeError` (the CLI turns them into exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from trtpipe.pipeline.estimate.estimator import estimate
from trtpipe.pipeline.estimate.model_facts import model_config_for
from trtpipe.pipeline.estimate.render import render
from trtpipe.pipeline.estimate.result import Estimate
from trtpipe.pipeline.recipe import Recipe, check_recipe_against_model, load_recipe, resolve_recipe_path
from trtpipe.pipeline.targets import HostMeasurement, get_target


def run_estimate(
    recipe: str | Path,
    target: str | None = None,
    as_json: bool = False,
    *,
    host: HostMeasurement | None = None,
    artifact_root: str | Path = "artifacts",
    console: Any = None,
) -> int:
    """``trtpipe estimate``: load the recipe (path or shipped name) and its model facts (no
    weights), estimate it on ``target`` (a name of the target table; default the recipe's
    target), print a rich report (or JSON with ``as_json``).

    ``host``: the cpu target's measurement (default: measured once per process). The last
    validate report of the recipe on that target, if any, is shown next to the predictions.
    Returns 0 when it fits and every budget is above its physical floor, 1 otherwise. Raises
    :class:`~trtpipe.plugins.core.errors.TrtpipeError` (RecipeError, ModelLoadError) for a bad
    recipe or model.
    """
    r = load_recipe(resolve_recipe_path(recipe), check_files=False)
    config = model_config_for(r)
    check_recipe_against_model(r, config)
    spec = get_target(target or r.target, host=host)
    report, report_path, report_note = _load_validate_report(r, spec.family, artifact_root)
    est = estimate(r, config, spec, report=report)
    if report_note is not None:
        est = _with_note(est, f"validate report not used: {report_note}")
    for note in _chunking_notes(r, spec.family, artifact_root):
        est = _with_note(est, note)
    if as_json:
        doc = est.to_dict()
        doc["validate_report"] = str(report_path) if report is not None else None
        out = console.file if console is not None else sys.stdout
        out.write(json.dumps(doc, indent=2) + "\n")
        return est.exit_code
    if console is None:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    render(est, r, config, console, report_path if report is not None else None)
    return est.exit_code


def _load_validate_report(
    recipe: Recipe, family: str, artifact_root: str | Path
) -> tuple[dict | None, Path, str | None]:
    """(report or None, its path, a note when it exists but cannot be read)."""
    from trtpipe.runtime.errors import ArtifactError
    from trtpipe.runtime.measure.report.document import load_report, validate_dir

    vdir = validate_dir(artifact_root, recipe.name, family)
    path = (vdir if recipe.named_as_file else vdir / f"recipe-{recipe.file_stem}") / "report.json"
    if not path.is_file():
        return None, path, None
    try:
        return load_report(path), path, None
    except ArtifactError as e:
        return None, path, str(e)


def _chunking_notes(recipe: Recipe, family: str, artifact_root: str | Path) -> list[str]:
    """The prefill chunk each scenario gets under ``runtime.scheduler.policy``, and why: from the
    artifact's measured step-cost model (``step_cost.json``) when there is one."""
    from trtpipe.pipeline.validate.scenario_budgets import scenario_itl_ratio, scenario_slo_budgets_ms
    from trtpipe.runtime.measure.report.document import validate_dir
    from trtpipe.runtime.sched.serving_budgets import derive_serving_budgets
    from trtpipe.runtime.sched.slo_policy import SloChunkPolicy, fcfs_description
    from trtpipe.runtime.sched.step_cost import STEP_COST_FILE, StepCostModel

    path = validate_dir(artifact_root, recipe.name, family).parent / STEP_COST_FILE
    try:
        cost = StepCostModel.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        cost = None
    notes = []
    for s in recipe.validation.scenarios:
        budget, itl_budget = scenario_slo_budgets_ms(recipe, s)
        ratio = scenario_itl_ratio(recipe, s)
        head = f"scenario {s.name}: prefill chunks: "
        if recipe.runtime.scheduler.policy == "fcfs":
            notes.append(
                head + fcfs_description("runtime.scheduler.policy fcfs", recipe.max_num_tokens, itl_budget, ratio)
            )
        elif cost is None:
            budgets = f"TPOT {budget:g} ms" if budget is not None else "the TPOT and ITL budgets serve derives"
            itl = f", ITL {itl_budget:g} ms" if itl_budget is not None else ""
            held = f", steps beside decodes up to {ratio:g}x the decode-only step" if ratio is not None else ""
            notes.append(
                head + f"slo at {budgets}{itl}{held}; the chunk size comes from the engine's "
                f"step-cost model, not measured yet ({path} is written by the first validate run)"
            )
        else:
            if budget is None:  # as validate runs it: the budgets serve derives for this engine
                derived = derive_serving_budgets(
                    cost, recipe.max_batch_size, recipe.max_seq_len, recipe.kv_cache.block_size
                )
                budget, itl_budget = derived.tpot_budget_ms, derived.itl_budget_ms
            policy = SloChunkPolicy(
                cost, budget, recipe.kv_cache.block_size, recipe.max_num_tokens, itl_budget,
                itl_during_prefill_ratio=ratio,
            )  # fmt: skip
            notes.append(head + policy.describe(recipe.max_batch_size))
    return notes


def _with_note(est: Estimate, note: str) -> Estimate:
    return dataclasses.replace(est, notes=est.notes + (note,))

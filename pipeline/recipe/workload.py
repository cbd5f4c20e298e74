"""A recipe's validate scenario as the runtime's :class:`~trtpipe.runtime.measure.workload.WorkloadSpec`.

The scenario was validated once, when the recipe was loaded (pydantic: lengths >= 1, min <= max,
exactly one of concurrency / arrival_rate_per_s, ...), so the record is handed over without a
second check; only what the schema cannot see is checked here: the prompt file's contents.
"""

from __future__ import annotations

from trtpipe.pipeline.recipe.schema import Recipe
from trtpipe.pipeline.recipe.schema_validate import OutputTokens, PromptTokens, Scenario
from trtpipe.runtime.measure.workload import WorkloadError, WorkloadSpec


def _span(spec: PromptTokens | OutputTokens) -> tuple[int, int]:
    """``fixed: n`` -> ``(n, n)``; ``uniform: {min, max}`` -> ``(min, max)`` (tokens, inclusive)."""
    if spec.fixed is not None:
        return spec.fixed, spec.fixed
    assert spec.uniform is not None  # exactly one of fixed/uniform (the schema's check)
    return spec.uniform.min, spec.uniform.max


def _read_prompts(recipe: Recipe, scenario: Scenario, file: str) -> tuple[str, ...]:
    """The non-blank lines of the scenario's prompt file; :class:`WorkloadError` naming the key when
    it cannot be read as UTF-8 or has no prompt."""
    path = recipe.resolve_path(file)
    where = f"scenario {scenario.name!r}: prompt_tokens.file = {file!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(
            f"{where}: cannot read {path} as UTF-8 text ({e}). Fix: a UTF-8 file, one prompt per line."
        ) from None
    prompts = tuple(line for line in text.splitlines() if line.strip())
    if not prompts:
        raise WorkloadError(f"{where}: {path} has no non-empty line. Fix: write one prompt per line.")
    return prompts


def scenario_workload_spec(recipe: Recipe, scenario: Scenario) -> WorkloadSpec:
    """The recipe's scenario in runtime terms (lengths as ``(min, max)`` tokens; a prompt file's
    prompts read from the recipe's folder). Raises :class:`WorkloadError` for an unreadable or
    empty prompt file."""
    pt = scenario.prompt_tokens
    return WorkloadSpec(
        name=scenario.name,
        num_requests=scenario.num_requests,
        num_warmup_requests=scenario.num_warmup_requests,
        output_tokens=_span(scenario.output_tokens),
        prompt_tokens=None if pt.file is not None else _span(pt),
        prompts=None if pt.file is None else _read_prompts(recipe, scenario, pt.file),
        concurrency=scenario.concurrency,
        arrival_rate_per_s=scenario.arrival_rate_per_s,
        seed=scenario.seed,
        system_prompt_tokens=scenario.system_prompt_tokens or 0,
        chat=scenario.chat,
    )

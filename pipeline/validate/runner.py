"""``trtpipe validate``: run a recipe's workloads on its built artifact and gate on the budgets.

    recipe ──► artifact (manifest checked: same recipe, files intact) ──► LLM
      ├─ correctness: greedy ids == golden ids (fp32 prefill and decode), else teacher-forced
      │  argmax agreement over the golden sequences >= validate.correctness.
      │  int4_teacher_forced_agreement_min
      └─ per scenario: make_workload ─► run_workload ─► summarize ─► evaluate_budgets
    ──► report (report.json, report.md, PNG plots under <artifact>/validate/) ──► exit code

Exit codes (:func:`run_validate` returns them; the CLI exits with them): 0 every budget,
correctness and the KV leak check passed; 1 any failed; usage, recipe and artifact errors raise
:class:`TrtpipeError`, which the CLI turns into 2.

Metrics follow DESIGN.md "Metrics" (see :mod:`trtpipe.runtime.metrics.request_metrics`): TTFT from the scheduled
arrival, so queueing is included; the prefill-only time is reported beside it; TPOT excludes the
first token; ITL is over all token gaps; percentiles interpolate linearly (numpy's default).

Artifact/recipe match: the artifact must come from this recipe. When the manifest records a
``build_info["build_hash"]`` (the hash of the build-relevant fields: every section but
``description``, ``runtime`` and ``validate``, see :func:`build_hash`) that is compared, so
budgets, scenarios and runtime settings can be edited without a rebuild; otherwise the full
recipe hash is compared.

The correctness check is :mod:`trtpipe.pipeline.validate.correctness` (a typed
:class:`CorrectnessResult`); one scenario's run :mod:`trtpipe.pipeline.validate.scenario`; the
console output and the gate line :mod:`trtpipe.pipeline.validate.output`; over HTTP
:mod:`trtpipe.pipeline.validate.http`. Under the ``slo`` policy each scenario's steps are
summarized as planned-vs-measured step times (:class:`~trtpipe.runtime.measure.step_cost_error.StepCostError`,
report.json ``env.step_cost_error``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtpipe.pipeline.artifact.locate import check_artifact_matches_recipe, missing_artifact_error, not_an_artifact_dir
from trtpipe.pipeline.recipe import (
    Recipe,
    Scenario,
    build_hash,
    load_recipe,
    recipe_hash,
    resolve_recipe_path,
    scenario_workload_spec,
)
from trtpipe.pipeline.validate.correctness import CorrectnessResult, check_correctness, load_golden, precision_label
from trtpipe.pipeline.validate.output import finish_report, gate_of_reports, print_scenario, validate_consoles
from trtpipe.pipeline.validate.scenario import run_scenario
from trtpipe.pipeline.validate.scenario_budgets import apply_scenario_budgets, run_budgets_ms, scenario_itl_ratio
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.host_cpu import cpu_identity
from trtpipe.runtime.errors import KVLeakError


class ValidateUsageError(TrtpipeError, ValueError):
    """A bad ``trtpipe validate`` invocation (e.g. an unknown ``--scenario``)."""


# ---------------------------------------------------------------------------------------------
# Recipe <-> artifact
# ---------------------------------------------------------------------------------------------


def load_recipe_for_validate(recipe: str | os.PathLike | Recipe) -> Recipe:
    """``recipe`` (a path, a shipped recipe name or a :class:`Recipe`) as a :class:`Recipe`, without
    looking up the model source."""
    if isinstance(recipe, Recipe):
        return recipe
    # the model source is not looked up: validate reads only the artifact (a device may have
    # received the artifact without the model package or the GGUF)
    return load_recipe(resolve_recipe_path(recipe), check_files=False)


def select_scenarios(recipe: Recipe, names: Sequence[str]) -> list[Scenario]:
    """The scenarios named (all when ``names`` is empty), in the recipe's order.

    Raises :class:`ValidateUsageError` listing the recipe's scenario names for an unknown one.
    """
    all_names = [s.name for s in recipe.validation.scenarios]
    unknown = [n for n in names if n not in all_names]
    if unknown:
        import difflib

        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, all_names, n=1)
            hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        listed = ", ".join(all_names) if all_names else "none (the recipe has no validate.scenarios)"
        raise ValidateUsageError(
            f"--scenario {', '.join(hints)}: not a scenario of recipe {recipe.name!r}. Expected one of: {listed}. "
            "Fix: pass one of those names, or leave --scenario out to run them all."
        )
    wanted = set(names)
    return [s for s in recipe.validation.scenarios if not wanted or s.name in wanted]


def engine_description(llm: Any) -> str:
    """``native CPU kernels (avx512_vnni, 2 threads)`` or ``ort 1.23.2`` (the manifest's backend)."""
    e = llm.engine
    if llm.capabilities.backend == "native":
        return f"native CPU kernels ({e.isa}, {e.threads} threads)"
    m = llm.manifest
    return f"{m.backend.get('name')} {m.backend.get('version')}"


def _env(llm: Any, recipe: Recipe, art: Path, threads: int | None) -> dict:
    m = llm.manifest
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "host": platform.node(),
        "cpu": cpu_identity(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15m_at_start": load,
        "backend": f"{m.backend.get('name')} {m.backend.get('version')}",
        "engine": engine_description(llm),
        "intra_op_threads": threads
        or m.runtime_options.get("intra_op_num_threads")
        or (
            llm.engine.threads
            if llm.capabilities.backend == "native"
            else "onnxruntime default (one per physical core)"
        ),
        "artifact_dir": str(art),
        "recipe_hash": recipe_hash(recipe),
        "build_hash": build_hash(recipe),
        "artifact_recipe_hash": m.recipe_hash,
        "trtpipe_version": m.trtpipe_version,
        "precision": precision_label(recipe),
        "prefix_caching": recipe.runtime.prefix_caching,
    }


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def report_dir(art: Path, recipe: Recipe, chosen: Sequence[Scenario]) -> Path:
    """Where a validate run writes its report: ``<artifact>/validate/`` for all of the recipe's
    scenarios; ``<artifact>/validate/scenarios-<a>+<b>/`` for a subset (``--scenario``), so a
    partial run never overwrites the full report (which ``trtpipe estimate`` reads). A recipe
    file named otherwise than its recipe (:attr:`Recipe.named_as_file`) keeps its reports in
    ``<artifact>/validate/recipe-<file>/`` (the same layout below it), so a copy with other
    budgets never replaces the report of the recipe whose artifact it validates."""
    base = art / "validate" if recipe.named_as_file else art / "validate" / f"recipe-{recipe.file_stem}"
    names = [s.name for s in chosen]
    if names == [s.name for s in recipe.validation.scenarios]:
        return base
    return base / ("scenarios-" + "+".join(names))


def run_validate(
    recipe: str | os.PathLike | Recipe,
    *,
    artifact_dir: str | os.PathLike | None = None,
    artifact_root: str | os.PathLike = "artifacts",
    scenarios: Sequence[str] = (),
    as_json: bool = False,
    threads: int | None = None,
    goodput: bool = False,
    goodput_time_s: float = 300.0,
) -> int:
    """Validate the recipe's artifact; return the gate's exit code (0 pass, 1 fail).

    ``recipe``: a path, a shipped recipe name or a :class:`Recipe`. ``artifact_dir``: the artifact
    (default ``<artifact_root>/<recipe>/<target>``). ``scenarios``: names to run (default all).
    ``as_json``: print report.json on stdout (the tables go to stderr). ``threads``: ONNX Runtime
    intra-op threads. The report is written to ``<artifact>/validate/`` (a subset of the
    scenarios: to a subfolder, :func:`report_dir`). ``goodput``: afterwards, search each Poisson
    scenario's highest arrival rate within its budgets (at most ``goodput_time_s`` per scenario;
    ``goodput.json`` and ``goodput.png`` next to the report; the exit code is unchanged).

    Raises :class:`TrtpipeError` (CLI exit 2) for a bad recipe, an unknown scenario, a missing,
    corrupted or mismatched artifact, or an artifact without golden outputs.
    """
    r = load_recipe_for_validate(recipe)
    chosen = select_scenarios(r, list(dict.fromkeys(scenarios)))  # repeated --scenario runs once
    specs = [(s, scenario_workload_spec(r, s)) for s in chosen]
    art, golden = _open_artifact(r, artifact_dir, artifact_root)
    out, err = validate_consoles(as_json)  # tables (stderr when stdout carries JSON), progress
    llm = _load_llm(r, art, threads, err)
    _refuse_chat_without_template(llm, [spec for _, spec in specs])
    env = _env(llm, r, art, threads)
    correctness = _run_correctness(llm, r, golden, out, err)
    reports = _run_scenarios(llm, r, specs, env, out, err)
    if llm.step_cost is not None:
        env["step_cost_model"] = json.loads(llm.step_cost.to_json())
    paths = _write_report(llm, r, art, chosen, reports, correctness, env)

    def search_goodput() -> None:
        from trtpipe.pipeline.validate.goodput import in_process_runner, run_goodput

        run_goodput(
            in_process_runner(llm),
            specs,
            paths.report_json.parent,
            err,
            out,
            time_budget_s=goodput_time_s,
            before_each=lambda s: apply_scenario_budgets(r, s, llm),
        )

    gate = gate_of_reports(reports, correctness.passed)
    return finish_report(out, err, paths, gate, as_json, then=search_goodput if goodput else None)


def _refuse_chat_without_template(llm: Any, specs: Sequence[Any]) -> None:
    """Refuse a ``chat: true`` scenario on a model without a chat template (a pretrained base
    model) before correctness and the other scenarios run, with the workload's own message."""
    from trtpipe.runtime.measure.workload import check_chat_template

    for spec in specs:
        check_chat_template(spec, llm.manifest.model.chat_template)


def _write_report(
    llm: Any,
    r: Recipe,
    art: Path,
    chosen: Sequence[Scenario],
    reports: list[Any],
    correctness: CorrectnessResult,
    env: dict,
) -> Any:
    """report.json, report.md and the plots (:func:`report_dir`), with each scenario's achieved decode
    bandwidth (and its share of a GPU target's; the cpu target's is not measured here)."""
    from trtpipe.pipeline.targets import get_target
    from trtpipe.runtime.measure.report.document import write_report
    from trtpipe.runtime.metrics.decode_bandwidth import read_model_from_manifest

    peak_bw = None if r.target == "cpu" else get_target(r.target).bandwidth_bytes_per_s
    return write_report(
        report_dir(art, r, chosen),
        recipe_name=r.name,
        target=r.target,
        scenarios=reports,
        correctness=correctness.to_dict(),
        env=env,
        decode_read=read_model_from_manifest(llm.manifest, llm.capabilities.backend),
        target_bandwidth_bytes_per_s=peak_bw,
    )


def _open_artifact(
    r: Recipe, artifact_dir: str | os.PathLike | None, artifact_root: str | os.PathLike
) -> tuple[Path, dict]:
    """The artifact folder and its golden outputs, after the cheap checks (it exists, it was built
    from this recipe); the LLM re-verifies the files when it loads them."""
    from trtpipe.pipeline.stages import artifact_dir_for
    from trtpipe.runtime.artifact.manifest import load_manifest

    art = Path(artifact_dir) if artifact_dir is not None else artifact_dir_for(r, artifact_root)
    if not (art / "manifest.json").is_file():
        if artifact_dir is not None:
            raise not_an_artifact_dir(art)
        raise missing_artifact_error(r, art)
    manifest = load_manifest(art, verify_hashes=False)
    check_artifact_matches_recipe(manifest, r, art)
    return art, load_golden(manifest)


def _load_llm(r: Recipe, art: Path, threads: int | None, err: Any) -> Any:
    from trtpipe.runtime.llm import LLM

    err.print(f"validate {r.name} on {r.target}: artifact {art}")
    if not r.named_as_file:
        err.print(
            f"  note: {Path(r.origin).name} is recipe {r.name} (its name:), so it validates {r.name}'s artifact; "
            f"its reports go to {art / 'validate' / f'recipe-{r.file_stem}'}, beside {r.name}'s own",
            markup=False,
        )
    t = time.perf_counter()
    llm = LLM(
        art,
        num_threads=threads,
        prefix_caching=r.runtime.prefix_caching,
        scheduler_policy=r.runtime.scheduler.policy,
        speculative=r.runtime.spec_config(),
    )
    err.print(
        f"  loaded in {time.perf_counter() - t:.1f} s ({engine_description(llm)}, prefill {r.precision.prefill}, "
        f"decode {r.precision.decode})"
    )
    return llm


def _run_correctness(llm: Any, r: Recipe, golden: dict, out: Any, err: Any) -> CorrectnessResult:
    """:func:`check_correctness`, timed. KV blocks still in use after its requests finished are a
    leak: the check fails with a note saying so (the gate exits 1 and the report is still written)."""
    err.print("correctness: comparing with the golden outputs recorded at build time ...")
    t = time.perf_counter()
    correctness = dataclasses.replace(check_correctness(llm, r, golden), seconds=round(time.perf_counter() - t, 2))
    try:
        llm.block_pool.check_all_free(after="the correctness requests finished")
    except KVLeakError as e:
        notes = "; ".join(n for n in (correctness.notes, str(e)) if n)
        correctness = dataclasses.replace(correctness, passed=False, notes=notes)
        err.print(str(e), markup=False)
    out.print(correctness.line())
    for line in correctness.failures():
        out.print(f"  {line}", markup=False)
    return correctness


def _run_scenarios(
    llm: Any, r: Recipe, specs: Sequence[tuple[Scenario, Any]], env: dict, out: Any, err: Any
) -> list[Any]:
    """Each scenario with its prefill-chunking budget set first (recorded in ``env``); under the
    ``slo`` policy, how well the step-cost model planned its steps (warm-up included) after it
    (``env["step_cost_error"]``, :class:`~trtpipe.runtime.measure.step_cost_error.StepCostError`);
    with ``runtime.speculative``, the scenario's verifies and acceptance (``env["spec_decode"]``,
    warm-up included). Both are read when the workload ends, before the engine probes run."""
    from trtpipe.runtime.measure.step_cost_error import StepCostError
    from trtpipe.runtime.metrics.spec_counters import SpeculationCounters

    reports = []
    env["prefill_chunking"], env["step_cost_error"], env["spec_decode"] = {}, {}, {}
    for scenario, spec in specs:
        tpot_ms, itl_ms = run_budgets_ms(r, scenario, llm)
        why = llm.set_tpot_budget(tpot_ms, itl_ms, scenario_itl_ratio(r, scenario))
        env["prefill_chunking"][scenario.name] = why
        err.print(f"scenario {scenario.name}: prefill chunks: {why}")
        llm.step_cost_log.clear()
        counters = llm.speculation_counters  # None while speculative decoding is off
        before = counters.copy() if counters is not None else None
        seen: dict[str, Any] = {}

        def after_workload(before=before, seen=seen) -> None:  # before the engine probes' requests
            now = llm.speculation_counters
            seen["spec"] = now.since(before) if now is not None and before is not None else None
            seen["steps"] = list(llm.step_cost_log)

        reports.append(run_scenario(llm, scenario, spec, err, after_workload=after_workload))
        if seen["spec"] is not None:  # this scenario's verifies (runtime.speculative)
            env["spec_decode"][scenario.name] = seen["spec"]
            err.print(f"  {SpeculationCounters.line(seen['spec'])}")
        if seen["steps"]:  # the slo policy logs its steps
            cost = StepCostError.of(seen["steps"], itl_ms)
            env["step_cost_error"][scenario.name] = cost.to_dict()
            err.print(f"  {cost.line()}")
        print_scenario(out, reports[-1])
    return reports


__all__ = [
    "ValidateUsageError",
    "build_hash",
    "check_artifact_matches_recipe",
    "check_correctness",
    "finish_report",
    "gate_of_reports",
    "load_golden",
    "load_recipe_for_validate",
    "print_scenario",
    "report_dir",
    "run_scenario",
    "run_validate",
    "scenario_workload_spec",
    "select_scenarios",
]

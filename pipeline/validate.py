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

Metrics follow DESIGN.md "Metrics" (see :mod:`trtpipe.runtime.metrics`): TTFT from the scheduled
arrival, so queueing is included; the prefill-only time is reported beside it; TPOT excludes the
first token; ITL is over all token gaps; percentiles interpolate linearly (numpy's default).

Artifact/recipe match: the artifact must come from this recipe. When the manifest records a
``build_info["build_hash"]`` (the hash of the build-relevant fields, i.e. everything but
``description`` and the ``validate`` section, see :func:`build_hash`) that is compared, so budgets
and scenarios can be edited without a rebuild; otherwise the full recipe hash is compared.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from trtpipe.pipeline.recipe import (CorrectnessSpec, Recipe, Scenario, build_hash, load_recipe, recipe_hash,
                                     resolve_recipe_path)
from trtpipe.plugins.errors import TrtpipeError
from trtpipe.runtime.errors import ArtifactError


class ValidateUsageError(TrtpipeError, ValueError):
    """A bad ``trtpipe validate`` invocation (e.g. an unknown ``--scenario``)."""


# ---------------------------------------------------------------------------------------------
# Recipe <-> artifact
# ---------------------------------------------------------------------------------------------


def check_artifact_matches_recipe(manifest: Any, recipe: Recipe, artifact_dir: Path) -> None:
    """Refuse an artifact built from another recipe (or an older version of this one).

    Compares :func:`build_hash` with ``manifest.build_info["build_hash"]`` when the build recorded
    it, else :func:`recipe_hash` with ``manifest.recipe_hash``. Raises :class:`ArtifactError`.
    """
    have_build = (manifest.build_info or {}).get("build_hash")
    if have_build is not None:
        want, have, what = build_hash(recipe), have_build, "build hash (all but description/validate)"
    else:
        want, have, what = recipe_hash(recipe), manifest.recipe_hash, "recipe hash"
    if want != have:
        raise ArtifactError(
            f"artifact {artifact_dir} was built from recipe {manifest.recipe_name!r} with {what} "
            f"{have[:12]}, but {recipe.origin} ({recipe.name!r}) hashes to {want[:12]}: the recipe "
            f"changed since the build, or this is another recipe's artifact. Fix: rebuild with "
            f"`trtpipe build {recipe.origin}`, or pass the recipe the artifact was built from.")


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
        raise ValidateUsageError(f"--scenario {', '.join(hints)}: not a scenario of recipe "
                                 f"{recipe.name!r}. Expected one of: {listed}.")
    wanted = set(names)
    return [s for s in recipe.validation.scenarios if not wanted or s.name in wanted]


def scenario_workload_spec(recipe: Recipe, scenario: Scenario):
    """The recipe's scenario as a runtime :class:`~trtpipe.runtime.workload.WorkloadSpec`."""
    from trtpipe.runtime.workload import WorkloadError, WorkloadSpec

    def span(spec) -> tuple[int, int]:
        return (spec.fixed, spec.fixed) if spec.fixed is not None else (spec.uniform.min, spec.uniform.max)

    pt = scenario.prompt_tokens
    prompts = None
    if pt.file is not None:
        path = recipe.resolve_path(pt.file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise WorkloadError(f"scenario {scenario.name!r}: prompt_tokens.file = {pt.file!r}: cannot "
                                f"read {path} as UTF-8 text ({e}). Fix: a UTF-8 file, one prompt "
                                "per line.") from None
        prompts = tuple(line for line in text.splitlines() if line.strip())
    return WorkloadSpec(
        name=scenario.name,
        num_requests=scenario.num_requests,
        num_warmup_requests=scenario.num_warmup_requests,
        output_tokens=span(scenario.output_tokens),
        prompt_tokens=None if pt.file is not None else span(pt),
        prompts=prompts,
        concurrency=scenario.concurrency,
        arrival_rate_per_s=scenario.arrival_rate_per_s,
        seed=scenario.seed,
        system_prompt_tokens=scenario.system_prompt_tokens or 0,
        chat=scenario.chat,
    ).check()


def _describe(spec) -> str:
    def rng(lo_hi):
        lo, hi = lo_hi
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    arrivals = (f"Poisson {spec.arrival_rate_per_s:g} req/s" if spec.arrival_rate_per_s is not None
                else f"closed loop, concurrency {spec.concurrency}")
    prompts = (f"{len(spec.prompts)} prompts from a file" if spec.prompts is not None
               else f"prompts {rng(spec.prompt_tokens)} tokens")
    return (f"{spec.num_warmup_requests} warm-up + {spec.num_requests} measured requests, {arrivals}, "
            f"{prompts}, outputs {rng(spec.output_tokens)} tokens, seed {spec.seed}")


# ---------------------------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------------------------


def load_golden(manifest: Any) -> dict:
    """golden.json of the artifact (recorded at build time); :class:`ArtifactError` if absent."""
    rebuild = manifest.rebuild_command
    if not manifest.golden_file:
        raise ArtifactError(f"artifact {manifest.root} records no golden outputs (golden_file is "
                            f"empty), so correctness cannot be checked. Fix: `{rebuild}`.")
    path = manifest.path(manifest.golden_file)
    try:
        golden = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ArtifactError(f"golden outputs {path}: unreadable ({e}). Fix: `{rebuild}`.") from None
    seqs = golden.get("sequences") if isinstance(golden, dict) else None
    ok = isinstance(seqs, list) and bool(seqs) and all(
        isinstance(s, dict) and s.get("prompt_ids") and s.get("output_ids") for s in seqs)
    if not ok:
        raise ArtifactError(f"golden outputs {path}: expected a non-empty \"sequences\" list whose "
                            f"items have prompt_ids and output_ids. Fix: `{rebuild}`.")
    return golden


def check_correctness(llm: Any, recipe: Recipe, golden: dict) -> dict:
    """Compare the artifact's outputs with the golden ones; a JSON-ready dict with ``passed``.

    fp32 prefill and decode: greedy ids must equal the golden ids exactly (both stop at EOS).
    Otherwise (INT4, fp16...): teacher-forced argmax agreement over all positions of the golden
    sequences must be >= ``validate.correctness.int4_teacher_forced_agreement_min`` (for an
    artifact whose INT4 weights were re-quantized for the plugin-free TensorRT lowering:
    ``plugin_free_teacher_forced_agreement_min``). Uses the
    first ``num_sequences`` golden sequences, each cut to ``num_tokens`` tokens.
    """
    from trtpipe.runtime.teacher_forcing import first_mismatch, greedy_ids, teacher_forced_agreement

    spec = recipe.validation.correctness
    source = "recipe" if spec is not None else "defaults (the recipe has no validate.correctness)"
    spec = spec or CorrectnessSpec()
    seqs = golden["sequences"][: spec.num_sequences]
    notes = []
    if len(seqs) < spec.num_sequences:
        notes.append(f"num_sequences {spec.num_sequences} asked, golden.json holds {len(seqs)}")
    if golden.get("num_tokens") is not None and golden["num_tokens"] < spec.num_tokens:
        notes.append(f"num_tokens {spec.num_tokens} asked, golden.json was recorded with "
                     f"{golden['num_tokens']}; rebuild to record more")
    prec = recipe.precision
    out: dict[str, Any] = {
        "reference": golden.get("reference", "golden.json"),
        "precision": f"prefill {prec.prefill}, decode {prec.decode}",
        "settings_from": source,
        "num_sequences": len(seqs),
    }
    rows = []
    if prec.prefill == "fp32" and prec.decode == "fp32":
        for s in seqs:
            want = [int(t) for t in s["output_ids"][: spec.num_tokens]]
            got = greedy_ids(llm, s["prompt_ids"], len(want))
            rows.append({"prompt": s.get("prompt", ""), "tokens": len(want), "exact": got == want,
                         "first_mismatch": first_mismatch(got, want)})
        num_ok = sum(r["exact"] for r in rows)
        out.update(method="exact greedy token ids (fp32 prefill and decode)",
                   passed=num_ok == len(rows), sequences_exact=f"{num_ok}/{len(rows)}",
                   num_tokens=sum(r["tokens"] for r in rows))
    else:
        agree = total = in_top5 = 0
        for s in seqs:
            want = [int(t) for t in s["output_ids"][: spec.num_tokens]]
            frac, preds = teacher_forced_agreement(llm, s["prompt_ids"], want)
            top5 = s.get("top5") or []
            n_top5 = sum(1 for i, p in enumerate(preds)
                         if i < len(top5) and p in [int(t) for t, _ in top5[i]])
            # How close the reference itself was to its runner-up where we disagree: near-ties
            # (small gaps) are quantization noise, large gaps point at a real error.
            gaps = [top5[i][0][1] - top5[i][1][1] for i, (p, w) in enumerate(zip(preds, want))
                    if p != w and i < len(top5) and len(top5[i]) > 1]
            rows.append({"prompt": s.get("prompt", ""), "tokens": len(want),
                         "agreement": round(frac, 4),
                         "max_reference_top1_gap_at_mismatch": round(max(gaps), 4) if gaps else None})
            agree += sum(p == w for p, w in zip(preds, want))
            total += len(want)
            in_top5 += n_top5
        agreement = agree / total
        threshold, gate_key = spec.int4_teacher_forced_agreement_min, "int4_teacher_forced_agreement_min"
        backend = getattr(getattr(llm, "manifest", None), "backend", None) or {}
        if (backend.get("int4_weights") in ("requantize_symmetric", "dequantize_float")
                and spec.plugin_free_teacher_forced_agreement_min is not None):
            # the plugin-free TensorRT variant runs changed weights (engine.plugin_free_int4): its own gate
            threshold = spec.plugin_free_teacher_forced_agreement_min
            gate_key = "plugin_free_teacher_forced_agreement_min"
        out.update(method="teacher-forced argmax agreement", agreement=round(agreement, 6),
                   agreeing_tokens=f"{agree}/{total}", threshold=threshold, threshold_key=gate_key,
                   passed=agreement >= threshold,
                   margin=round(agreement - threshold, 6),
                   in_reference_top5=f"{in_top5}/{total}", num_tokens=total)
    out["sequences"] = rows
    if notes:
        out["notes"] = "; ".join(notes)
    return out


def _correctness_line(c: dict) -> str:
    verdict = "[green]PASS[/green]" if c["passed"] else "[red]FAIL[/red]"
    if "agreement" in c:
        return (f"correctness ({c['precision']}): teacher-forced agreement {c['agreement']:.4f} "
                f"({c['agreeing_tokens']} tokens) vs min {c['threshold']:g}, margin "
                f"{c['margin']:+.4f}: {verdict}")
    return (f"correctness ({c['precision']}): exact greedy ids on {c['sequences_exact']} golden "
            f"sequences: {verdict}")


# ---------------------------------------------------------------------------------------------
# Output helpers
# ---------------------------------------------------------------------------------------------


def _metrics_table(name: str, summary: Any):
    from rich.table import Table

    from trtpipe.runtime.metrics import LATENCY_METRICS, PERCENTILES

    t = Table(title=f"scenario {name}: latency (ms)", title_justify="left")
    t.add_column("metric")
    for p in (*PERCENTILES, "mean"):
        t.add_column(p, justify="right")
    t.add_column("n", justify="right")
    labels = {"ttft": "TTFT (from arrival)", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E",
              "prefill": "prefill only", "queue": "queue"}
    for m in LATENCY_METRICS:
        d = getattr(summary, m)
        if d is None:
            t.add_row(labels[m], *["–"] * 5, "0")
        else:
            t.add_row(labels[m], *(f"{d.get(p) * 1e3:.1f}" for p in (*PERCENTILES, "mean")), str(d.count))
    return t


def _summary_line(s: Any) -> str:
    def opt(x, fmt="{}"):
        return "–" if x is None else fmt.format(x)

    leak = {None: "not checked", True: "[green]all free[/green]", False: "[red]LEAK[/red]"}[s.kv_leak_free]
    return (f"  output {opt(s.output_tokens_per_s, '{:.1f}')} tokens/s over {s.wall_s:.2f} s; decode "
            f"batch peak {opt(s.peak_decode_batch_size)} mean {opt(s.mean_decode_batch_size, '{:.2f}')}; "
            f"KV blocks peak {opt(s.peak_kv_blocks_used)}/{opt(s.num_kv_blocks)}, at end "
            f"{opt(s.kv_blocks_in_use_at_end)} ({leak}); peak RSS "
            f"{opt(s.peak_rss_bytes and s.peak_rss_bytes / 2**20, '{:.0f}')} MiB; prefix cache "
            f"{s.prefix_cache_hits_tokens}/{s.total_prompt_tokens} prompt tokens hit")


def run_scenario(llm: Any, scenario: Scenario, spec: Any, err: Any, run: Any = None, tokenizer: Any = None,
                  chat_template: str | None = None):
    """Run one scenario's workload (progress on ``err``); its :class:`ScenarioReport`.

    ``run(items, concurrency, on_request_done)`` replaces the in-process ``run_workload(llm, ...)``
    (``validate --url`` passes the HTTP runner), ``tokenizer`` the LLM's (same return shapes) and
    ``chat_template`` the manifest's (for ``chat`` workloads; ``llm`` None).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtpipe.runtime.budgets import evaluate_budgets
    from trtpipe.runtime.metrics import summarize
    from trtpipe.runtime.report import ScenarioReport
    from trtpipe.runtime.workload import make_workload, run_workload

    err.print(f"scenario {scenario.name}: {_describe(spec)}")
    items = make_workload(spec, tokenizer or llm.tokenizer,
                          chat_template=chat_template if llm is None else llm.manifest.model.chat_template)
    run = run or (lambda items, concurrency, on_request_done: run_workload(
        llm, items, concurrency, on_request_done=on_request_done))
    t = time.perf_counter()
    with Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as bar:
        task = bar.add_task(f"{scenario.name} (after {spec.num_warmup_requests} warm-up)",
                            total=spec.num_requests)
        metrics, wall_s, stats = run(items, spec.concurrency,
                                     lambda done, total: bar.update(task, completed=done))
    summary = summarize(metrics, wall_s, stats)
    results = evaluate_budgets(summary, scenario.budgets.budget_dicts())
    err.print(f"  done in {time.perf_counter() - t:.1f} s")
    return ScenarioReport(scenario.name, summary, tuple(results), tuple(metrics))


def print_scenario(out: Any, rep: Any) -> None:
    """The latency table, the run facts and the budget table (measured, limit, margin, result)."""
    from trtpipe.runtime.report import render_rich_table

    out.print(_metrics_table(rep.name, rep.summary))
    out.print(_summary_line(rep.summary))
    if rep.budget_results:
        out.print(render_rich_table(rep.budget_results, title=f"scenario {rep.name}: budgets"))
    else:
        out.print(f"  scenario {rep.name}: no budgets")


def _env(llm: Any, recipe: Recipe, art: Path, threads: int | None) -> dict:
    m = llm.manifest
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15m_at_start": load,
        "backend": f"{m.backend.get('name')} {m.backend.get('version')}",
        "intra_op_threads": threads or m.runtime_options.get("intra_op_num_threads")
        or "onnxruntime default (one per physical core)",
        "artifact_dir": str(art),
        "recipe_hash": recipe_hash(recipe),
        "build_hash": build_hash(recipe),
        "artifact_recipe_hash": m.recipe_hash,
        "trtpipe_version": m.trtpipe_version,
        "precision": f"prefill {recipe.precision.prefill}, decode {recipe.precision.decode}",
        "prefix_caching": recipe.kv_cache.prefix_caching,
    }


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def scenario_tpot_budget_ms(recipe: Recipe, scenario: Scenario) -> float | None:
    """The TPOT budget the ``slo`` policy keeps in this scenario: ``scheduler.tpot_budget_ms``,
    else the scenario's tightest ``tpot_ms`` / ``itl_ms`` limit, else None (FCFS)."""
    if recipe.scheduler.tpot_budget_ms is not None:
        return recipe.scheduler.tpot_budget_ms
    limits = [v for m, _, v in scenario.budgets.limits() if m in ("tpot_ms", "itl_ms")]
    return min(limits) if limits else None


def report_dir(art: Path, recipe: Recipe, chosen: Sequence[Scenario]) -> Path:
    """Where a validate run writes its report: ``<artifact>/validate/`` for all of the recipe's
    scenarios; ``<artifact>/validate/scenarios-<a>+<b>/`` for a subset (``--scenario``), so a
    partial run never overwrites the full report (which ``trtpipe estimate`` reads)."""
    names = [s.name for s in chosen]
    if names == [s.name for s in recipe.validation.scenarios]:
        return art / "validate"
    return art / "validate" / ("scenarios-" + "+".join(names))


def run_validate(recipe: str | os.PathLike | Recipe, *, artifact_dir: str | os.PathLike | None = None,
                 artifact_root: str | os.PathLike = "artifacts", scenarios: Sequence[str] = (),
                 as_json: bool = False, threads: int | None = None, goodput: bool = False,
                 goodput_time_s: float = 300.0) -> int:
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
    from rich.console import Console

    from trtpipe.pipeline.build import artifact_dir_for
    from trtpipe.runtime.llm import LLM
    from trtpipe.runtime.manifest import load_manifest
    from trtpipe.runtime.report import write_report

    r = load_recipe_for_validate(recipe)
    names = list(dict.fromkeys(scenarios))  # repeated --scenario runs once
    chosen = select_scenarios(r, names)
    specs = [(s, scenario_workload_spec(r, s)) for s in chosen]
    art = Path(artifact_dir) if artifact_dir is not None else artifact_dir_for(r, artifact_root)
    if artifact_dir is None and not (art / "manifest.json").is_file():
        from trtpipe.pipeline.cli_artifact import missing_artifact_error

        raise missing_artifact_error(r, art, extra_fix=", or pass --artifact DIR")
    manifest = load_manifest(art, verify_hashes=False)  # cheap checks first; LLM re-verifies files
    check_artifact_matches_recipe(manifest, r, art)
    golden = load_golden(manifest)

    out = Console(stderr=as_json, highlight=False)  # tables; stderr when stdout carries JSON
    err = Console(stderr=True, highlight=False)  # progress
    err.print(f"validate {r.name} on {r.target}: artifact {art}")
    t = time.perf_counter()
    llm = LLM(art, num_threads=threads, prefix_caching=r.kv_cache.prefix_caching,
              scheduler_policy=r.scheduler.policy)
    err.print(f"  loaded in {time.perf_counter() - t:.1f} s ({llm.manifest.backend.get('name')} "
              f"{llm.manifest.backend.get('version')}, prefill {r.precision.prefill}, decode "
              f"{r.precision.decode})")
    env = _env(llm, r, art, threads)

    err.print("correctness: comparing with the golden outputs recorded at build time ...")
    t = time.perf_counter()
    correctness = check_correctness(llm, r, golden)
    correctness["seconds"] = round(time.perf_counter() - t, 2)
    llm.block_pool.check_all_free(after="the correctness check")
    out.print(_correctness_line(correctness))

    reports = []
    env["prefill_chunking"] = {}
    for scenario, spec in specs:
        why = llm.set_tpot_budget(scenario_tpot_budget_ms(r, scenario))
        env["prefill_chunking"][scenario.name] = why
        err.print(f"scenario {scenario.name}: prefill chunks: {why}")
        reports.append(run_scenario(llm, scenario, spec, err))
        print_scenario(out, reports[-1])
    if llm.step_cost is not None:
        env["step_cost_model"] = json.loads(llm.step_cost.to_json())

    paths = write_report(report_dir(art, r, chosen), recipe_name=r.name, target=r.target, scenarios=reports,
                         correctness=correctness, env=env)

    def search_goodput() -> None:
        from trtpipe.pipeline.goodput import in_process_runner, run_goodput

        run_goodput(in_process_runner(llm), specs, paths.report_json.parent, err, out, time_budget_s=goodput_time_s,
                    before_each=lambda s: llm.set_tpot_budget(scenario_tpot_budget_ms(r, s)))

    return finish_report(out, err, paths, as_json, then=search_goodput if goodput else None)


def finish_report(out: Any, err: Any, paths: Any, as_json: bool, then: Callable[[], None] | None = None) -> int:
    """Print the gate line and where the report went; run ``then`` (e.g. the goodput search);
    print report.json on stdout with ``as_json``. Returns the gate's exit code."""
    doc = json.loads(paths.report_json.read_text(encoding="utf-8"))
    gate = doc["gate"]
    word = {None: "not run", True: "pass", False: "[red]FAIL[/red]"}
    verdict = "[green]PASS[/green]" if gate["passed"] else "[red]FAIL[/red]"
    out.print(f"gate: {verdict} (exit {gate['exit_code']}): budgets {word[gate['budgets_passed']]}, "
              f"correctness {word[gate['correctness_passed']]}, KV leak check "
              f"{word[gate['kv_leak_free']]}")
    out.print(f"report: {paths.report_json} (+ report.md and {len(paths.plots())} plots in "
              f"{paths.report_json.parent})")
    if paths.notice:
        err.print(paths.notice, markup=False)  # "[plots]" in the notice is text, not rich markup
    if then is not None:
        then()
    if as_json:
        sys.stdout.write(paths.report_json.read_text(encoding="utf-8"))
        sys.stdout.flush()
    return int(gate["exit_code"])

__all__ = ["ValidateUsageError", "build_hash", "scenario_tpot_budget_ms", "check_artifact_matches_recipe",
           "check_correctness", "finish_report", "load_golden", "load_recipe_for_validate", "print_scenario",
           "report_dir", "run_scenario", "run_validate", "scenario_workload_spec", "select_scenarios"]

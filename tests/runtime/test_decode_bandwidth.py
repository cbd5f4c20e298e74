"""Bytes one decode step reads and the achieved bandwidth, against figures computed by hand."""

from types import SimpleNamespace

import pytest

from trtpipe.runtime.artifact.model_config import ModelConfig
from trtpipe.runtime.metrics.decode_bandwidth import (
    DecodeBandwidth,
    DecodeReadModel,
    decode_bandwidth,
    decode_read_model,
    kv_bytes_per_layer,
    read_model_from_manifest,
    scenario_decode_bandwidth,
    weight_read_bytes,
)

# SmolLM2-135M facts (the shipped GGUF's metadata)
SMOL = ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1e5, 1e-5, True)
SMOL_EMB_FP32 = 49152 * 576 * 4  # 113,246,208 B


def test_kv_bytes_per_layer_caps_windowed_layers():
    # 2 kv heads x head_dim 8 x 2 B x 2 (K and V) = 64 B per token and layer
    assert kv_bytes_per_layer((2, 2), (4, 0), 8, 10, "fp16") == (64 * 4, 64 * 10)
    assert kv_bytes_per_layer((2, 1), (0, 0), 8, 3, "fp32") == (2 * 2 * 8 * 4 * 3, 2 * 1 * 8 * 4 * 3)


def test_weight_read_skips_a_gathered_embedding_only():
    assert weight_read_bytes(1000, 300, embedding_is_lm_head=False) == 700
    assert weight_read_bytes(1000, 300, embedding_is_lm_head=True) == 1000


def test_smollm2_int4_cpu_initializers_separate_8bit_head():
    inits = {
        "ref.embed_tokens": ["float32", [49152, 576], 0, SMOL_EMB_FP32],
        "ref.norm.weight": ["float32", [576], SMOL_EMB_FP32, 2304],
        "n0_241/zero_points_u8_1": ["uint8", [49152, 18], 0, 884736],  # the 8-bit LM head's zero points
    }
    m = decode_read_model(SMOL, "float32", 231_337_984, "fp32", inits)
    assert m.weight_read_bytes == 231_337_984 - SMOL_EMB_FP32 == 118_091_776
    # KV: 30 layers x 2 x 3 heads x 64 x 4 B = 46,080 B per token
    assert m.kv_read_bytes(100) == 4_608_000
    assert m.kv_read_bytes(100, batch=3) == 3 * 4_608_000
    assert m.step_read_bytes(100) == 118_091_776 + 4_608_000


def test_tied_fp32_table_is_read_whole():
    inits = {
        "ref.embed_tokens": ["float32", [49152, 576], 0, SMOL_EMB_FP32],
        "ref.norm.weight": ["float32", [576], 0, 2304],
    }
    assert decode_read_model(SMOL, "float32", 500_000_000, "fp32", inits).weight_read_bytes == 500_000_000


def test_without_initializers_the_model_facts_decide():
    untied = ModelConfig("llama", 2, 64, 4, 2, 16, 128, 256, 512, 1e4, 1e-5, False)
    m = decode_read_model(untied, "float16", 100_000, "fp16")
    assert m.weight_read_bytes == 100_000 - 256 * 64 * 2
    assert m.kv_dtype == "float16"
    # an int8 pool reads its scales too: 2 x 2 kv heads x (16 + 4) B per token, 10 tokens
    int8 = decode_read_model(untied, "int8", 100_000, "fp16")
    assert int8.kv_read_bytes(10) - int8.kv_read_bytes(0) == 2 * 2 * 2 * 20 * 10
    # reports written before the dtype was recorded carry its bytes
    legacy = {**m.to_dict(), "kv_dtype_bytes": 2}
    del legacy["kv_dtype"]
    assert DecodeReadModel.from_dict(legacy) == m
    assert decode_read_model(SMOL, "float16", 100_000_000, "fp16").weight_read_bytes == 100_000_000


def test_bandwidth_and_fraction_of_peak():
    bw = DecodeBandwidth(122_699_776, 0.008, 30e9)
    assert bw.bytes_per_s == pytest.approx(15.337472e9)
    assert bw.fraction_of_peak == pytest.approx(15.337472 / 30)
    assert bw.describe() == "decode bandwidth 15.3 GB/s (122.7 MB per step / 8 ms TPOT; 51% of 30.0 GB/s)"
    assert DecodeBandwidth(1e9, 0.5).describe() == "decode bandwidth 2.0 GB/s (1000.0 MB per step / 500 ms TPOT)"


def test_decode_bandwidth_needs_a_tpot():
    m = decode_read_model(SMOL, "float32", 231_337_984, "fp32")
    assert decode_bandwidth(m, None, 10) is None
    # tied, no initializer table: the whole 231 MB are read; batch 2 at 10 tokens: 2 x 460,800 B KV
    assert decode_bandwidth(m, 0.01, 10, 2).step_read_bytes == 231_337_984 + 921_600


def test_scenario_bandwidth_from_a_report_summary():
    m = decode_read_model(SMOL, "float32", 118_091_776, "fp32", {})  # {}: no table, tied -> read whole
    summary = {
        "num_requests": 4,
        "total_prompt_tokens": 400,
        "total_output_tokens": 200,
        "mean_decode_batch_size": 2.5,
        "tpot_ms": {"p50": 10.0},
    }
    bw = scenario_decode_bandwidth(m, summary)
    # context = (400 + 200 / 2) / 4 = 125 tokens; KV 2.5 x 125 x 46,080 = 14,400,000 B
    assert bw.step_read_bytes == 118_091_776 + 14_400_000
    assert bw.tpot_s == pytest.approx(0.010)
    assert scenario_decode_bandwidth(m, {**summary, "tpot_ms": None}) is None


def test_read_model_from_manifest_needs_weights_bytes():
    manifest = SimpleNamespace(
        build_info={},
        graphs={"decode": SimpleNamespace(precision="int4")},
        target={"name": "cpu"},
        model=SMOL,
        kv=SimpleNamespace(dtype="float32"),
        runtime_options={},
    )
    assert read_model_from_manifest(manifest) is None
    manifest.build_info["weights_bytes"] = 231_337_984
    assert read_model_from_manifest(manifest).weight_read_bytes == 231_337_984  # tied, no table


def test_the_default_artifact(default_artifact):
    """The shipped artifact: on ONNX Runtime a decode step reads every initializer of the graph
    that runs it but the fp32 embedding table, which it only gathers (counted here from the ONNX
    file itself); on the native engine (where built) it reads native.bin whole: the tied Q8
    embedding is the LM head, so there is nothing to leave out (issue 26's bound: <= 97 MB)."""
    import onnx

    from trtpipe.runtime.artifact.manifest import load_manifest

    man = load_manifest(default_artifact, verify_hashes=False)
    m = read_model_from_manifest(man)
    graph = onnx.load(
        str(default_artifact / f"{man.runtime_options['ort_decode_graph']}.onnx"), load_external_data=False
    )
    ops_of: dict[str, set] = {}
    for n in graph.graph.node:
        for x in n.input:
            ops_of.setdefault(x, set()).add(n.op_type)
    nbytes = {
        t.name: int({e.key: e.value for e in t.external_data}["length"])
        if t.external_data
        else onnx.numpy_helper.to_array(t).nbytes
        for t in graph.graph.initializer
    }
    gathered = {k: v for k, v in nbytes.items() if ops_of.get(k) == {"Gather"}}
    assert max(gathered.values()) == SMOL_EMB_FP32 and sum(gathered.values()) < SMOL_EMB_FP32 + 1024
    ort_bytes = man.build_info.get("decode_weight_read_bytes_ort", m.weight_read_bytes)
    assert ort_bytes == sum(nbytes.values()) - sum(gathered.values())
    data = (default_artifact / man.runtime_options["shared_data_file"]).stat().st_size
    assert data - SMOL_EMB_FP32 - 3e6 < ort_bytes <= data - SMOL_EMB_FP32  # the rest: 4 KiB alignment
    native = man.runtime_options.get("native")
    if native:
        assert m.weight_read_bytes == (default_artifact / native["weights_file"]).stat().st_size <= 97e6
    assert m.kv_read_bytes(1) == 2 * 30 * 3 * 64 * 2 == 23_040  # the recipe's fp16 pool


def test_validate_report_carries_the_bandwidth_next_to_tokens_per_s():
    from trtpipe.runtime.measure.report.document import build_report, render_markdown
    from trtpipe.runtime.measure.report.records import ScenarioReport
    from trtpipe.runtime.metrics.request_metrics import RequestTimer, summarize

    def req(rid, arrival, token_times):
        t = RequestTimer(rid, prompt_tokens=8, arrival_s=arrival)
        for x in token_times:
            t.on_tokens(x, 1)
        return t.metrics()

    # TPOT 0.2 s and 0.4 s -> p50 300 ms; 3 requests, 24 prompt + 7 output tokens
    reqs = [req("a", 0.0, [0.5, 0.6, 0.8, 1.1]), req("b", 0.0, [0.3]), req("c", 1.0, [1.2, 1.6])]
    scen = ScenarioReport("chat", summarize(reqs, wall_s=2.0), (), tuple(reqs))
    model = decode_read_model(SMOL, "float32", 118_091_776, "fp32")  # tied, no table: read whole
    doc = build_report(
        recipe_name="r",
        target="orin",
        scenarios=[scen],
        correctness={},
        env={},
        decode_read=model,
        target_bandwidth_bytes_per_s=204.8e9,
    )
    bw = doc["scenarios"][0]["decode_bandwidth"]
    # context round((24 + 7 / 2) / 3) = 9 tokens, batch 1: KV 9 x 46,080 = 414,720 B
    assert bw["step_read_bytes"] == 118_091_776 + 414_720
    assert bw["bytes_per_s"] == pytest.approx(118_506_496 / 0.3)
    assert bw["fraction_of_peak"] == pytest.approx(118_506_496 / 0.3 / 204.8e9)
    md = render_markdown(doc)
    assert (
        "- output tokens/s: 3.50; decode bandwidth 0.4 GB/s (118.5 MB per step / 300 ms TPOT; 0% of "
        "204.8 GB/s) at TPOT p50"
    ) in md
    plain = build_report(recipe_name="r", target="cpu", scenarios=[scen], correctness={}, env={})
    assert plain["scenarios"][0]["decode_bandwidth"] is None
    assert "decode bandwidth" not in render_markdown(plain)


@pytest.mark.slow
def test_generate_prints_tokens_per_s_and_bandwidth(default_artifact):
    import re

    from click.testing import CliRunner

    from trtpipe.pipeline.cli.main import main

    res = CliRunner().invoke(
        main, ["generate", str(default_artifact), "Hello", "--max-new-tokens", "4", "--no-stream", "--temperature", "0"]
    )
    assert res.exit_code == 0, res.output
    m = re.search(
        r"TPOT ([\d.]+) ms; decode ([\d.]+) tokens/s, decode bandwidth ([\d.]+) GB/s "
        r"\(([\d.]+) MB per step",
        res.stderr,
    )
    assert m, res.stderr
    tpot_ms, rate, gb_s, mb = map(float, m.groups())
    assert rate == pytest.approx(1e3 / tpot_ms, rel=0.01)
    # the weights one decode step reads (build_info: on ONNX Runtime 120.28 MB, the decode graph's
    # initializers minus the fp32 table it only gathers; native.bin's 96.58 MB on the native
    # engine) + the KV of a few tokens (46 KB each)
    from trtpipe.runtime.artifact.manifest import load_manifest

    weights_mb = load_manifest(default_artifact, verify_hashes=False).build_info["decode_weight_read_bytes"] / 1e6
    assert weights_mb < mb < weights_mb + 0.6
    assert gb_s == pytest.approx(mb / tpot_ms, rel=0.05)

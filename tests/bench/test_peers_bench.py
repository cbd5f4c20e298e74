"""bench/peers.py without measuring: the command line, the floors from the estimate's roofline
(hand-computed figures), and docs/benchmarks.md rendered from a small raw-results document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import md_analysis  # noqa: E402
import peers  # noqa: E402
import peers_floors  # noqa: E402
import peers_report  # noqa: E402


def _run(ttft, tpot, tps, **extra):
    return {
        "engine": "x",
        "load_s": 1.5,
        "ttft_s": dict(zip(("16", "128", "512"), ttft)),
        "tpot_s": dict(zip(("16", "128", "512"), tpot)),
        "first_output_ids": {"16": [1], "128": [1, 2], "512": [3]},
        "concurrent": {"num_requests": 8, "wall_s": 2.0, "output_tokens_per_s": tps},
        "foreign_load_cores": 0.1,
        "peak_rss_bytes": 400 * 2**20,
        "cpu_share": 0.95,
        "versions": {"engine": "1.0"},
        "extra": extra,
        "round": 0,
        "worker_wall_s": 30.0,
    }


FLOORS = peers_floors.Floors(
    "smollm2-135m-cpu",
    30e9,
    179e9,
    114_160_896,
    {16: 0.0193, 128: 0.155, 512: 0.658},
    {16: 0.00388, 128: 0.00405, 512: 0.00464},
    250.5,
)

RAW = {
    "meta": {
        "date": "2026-12-01 08:00 UTC",
        "repeats": 1,
        "rounds": 1,
        "max_foreign_load": 0.3,
        "threads": 2,
        "wall_s": 120.0,
        "floors": FLOORS.to_dict(),
        "host_peaks": {
            "threads": 2,
            "read_bytes_per_s": 20e9,
            "copy_bytes_per_s": 17.6e9,
            "fp32_flops_per_s": 112e9,
            "int8_ops_per_s": 217e9,
            "int4_gemm_ops_per_s": 104e9,
            "int4_gemv_bytes_per_s": 7.6e9,
        },
        "machine": {
            "cpu": "AMD EPYC",
            "cpus": "2",
            "platform": "Linux",
            "python": "3.11",
            "mem_gib": 23.5,
            "loadavg_start": [0.5, 0.4, 0.3],
            "loadavg_end": [0.6, 0.5, 0.4],
        },
    },
    "runs": {
        "trtpipe": [
            _run(
                (0.03, 0.2, 0.9),
                (0.008, 0.0085, 0.01),
                300.0,
                weights_bytes=231_337_984,
                kv_pool_bytes=378_224_640,
                concurrent_ttft_s=[0.5, 0.6],
                concurrent_tpot_s=[0.02, 0.03],
            )
        ],
        "llama.cpp": [
            _run((0.04, 0.25, 1.1), (0.009, 0.0095, 0.011), 110.0),
            {**_run((0.05, 0.3, 1.2), (0.01, 0.01, 0.012), 100.0), "foreign_load_cores": 0.9},
        ],
        "ortgenai-int4": [{"error": "setup step 'onnxruntime-genai' failed: exit 1"}],
    },
    "profile": {
        "num_steps": 64,
        "prompt_tokens": 128,
        "threads": 2,
        "ort_run_s": 0.007,
        "engine_wrapper_s": 0.0004,
        "overhead_s": 0.0006,
        "step_s": 0.008,
        "overhead_fraction": 0.075,
        "overhead_incl_wrapper_fraction": 0.125,
    },
    "setup": {"llama.cpp": {"ok": True, "seconds": 300.0, "when": "2026-12-01T07:00:00Z"}},
}


def test_help_lists_the_flags():
    r = subprocess.run([sys.executable, str(BENCH / "peers.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for flag in ("--setup", "--engines", "--repeats", "--max-foreign-load", "--from-json", "--no-profile"):
        assert flag in r.stdout


def test_names_other_scripts_import():
    assert peers.RESULT_MARK == "@@peers-result@@ "
    assert peers.DEFAULT_ARTIFACT.parts[-3:] == ("artifacts", "smollm2-135m-cpu", "cpu")
    for name in (
        "prompt_token_ids",
        "gguf_path",
        "wait_quiet",
        "machine_info",
        "read_requirement_groups",
        "TEXT",
        "REPO",
        "MAIN_VENV",
        "BENCH_VENV",
        "GGUF_NAME",
    ):
        assert hasattr(peers, name), name


def test_floors_from_the_estimate_by_hand():
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path
    from trtpipe.runtime.artifact.model_config import ModelConfig

    smol = ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1e5, 1e-5, True)
    recipe = load_recipe(resolve_recipe_path("smollm2-135m-cpu"), check_files=False)
    f = peers_floors.floors_for(recipe, smol, 30e9, 179e9)
    # int4 decode weights read per step (test_estimate: 4-bit GEMMs + groups + 8-bit head + norms)
    assert f.decode_weight_read_bytes == 111_617_280
    # TPOT at 16 prompt tokens: mean context 16 + 32 = 48 tokens x 23,040 B of fp16 KV
    # (30 layers x 2 x 3 kv heads x 64 x 2 B)
    assert f.tpot_s[16] == pytest.approx((111_617_280 + 48 * 23_040) / 30e9)
    # TTFT at 512 tokens: compute-bound, 117,850,374,144 FLOP (test_estimate's hand count)
    assert f.ttft_s[512] == pytest.approx(117_850_374_144 / 179e9)
    # 8 x 128-token prefills, then 64 batch-8 decode steps at 160 tokens of context: compute-bound,
    # 8 x (2 x 106,168,320 GEMM weights + 30 x 4 x 9 x 64 x 160 attention + 2 x 576 x 49,152 logits)
    # = 8 x 280,018,944 FLOP at 179 GFLOP/s (12.5 ms) > (111.6 MB + 8 x 160 x 23,040 B) / 30 GB/s (4.7 ms)
    step = 8 * 280_018_944 / 179e9
    assert f.tps == pytest.approx(8 * 64 / (8 * f.ttft_s[128] + 64 * step))
    assert peers_floors.Floors.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    assert f.gemm_compute == "fp32"  # no int8 peak given


def test_int8_floor_for_int8_activations_only():
    """INT4 GEMMs that take int8 activations in prefill (accuracy level 4) get compute floors at
    the int8 peak; with fp32 activations (level 0, the default recipe's) they stay at the fp32 peak."""
    import yaml

    from trtpipe.pipeline.recipe import load_recipe, parse_recipe, resolve_recipe_path
    from trtpipe.runtime.artifact.model_config import ModelConfig

    smol = ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1e5, 1e-5, True)
    default = load_recipe(resolve_recipe_path("smollm2-135m-cpu"), check_files=False)
    data = yaml.safe_load(resolve_recipe_path("smollm2-135m-cpu").read_text())
    data["engine"]["ort_accuracy_level"] = 4
    recipe = parse_recipe(data)
    f = peers_floors.floors_for(recipe, smol, 30e9, 179e9, 400e9)
    assert f.gemm_compute == "int8" and f.int8_ops_per_s == 400e9
    assert f.ttft_s[512] == pytest.approx(117_850_374_144 / 400e9)  # the same FLOP at the int8 peak
    # the bandwidth-bound decode floor does not move
    assert f.tpot_s[16] == pytest.approx((111_617_280 + 48 * 23_040) / 30e9)
    g = peers_floors.floors_for(default, smol, 30e9, 179e9, 400e9)
    assert g.gemm_compute == "fp32" and g.ttft_s[512] == pytest.approx(117_850_374_144 / 179e9)
    assert "400 GOP/s int8; GEMMs at the int8 peak" in f.describe()
    # the native engine (int8 activations whatever ort_accuracy_level says) reads native.bin's
    # 96,576,768 bytes a decode step instead of the graphs' 111,617,280, plus the same KV
    n = peers_floors.floors_for(default, smol, 30e9, 179e9, 400e9, native_weight_bytes=96_576_768)
    assert n.gemm_compute == "int8" and n.ttft_s[512] == pytest.approx(117_850_374_144 / 400e9)
    assert n.decode_weight_read_bytes == 96_576_768
    assert n.tpot_s[16] == pytest.approx((96_576_768 + 48 * 23_040) / 30e9)


def test_from_json_renders_the_report_and_keeps_the_analysis(tmp_path):
    raw, doc = tmp_path / "raw.json", tmp_path / "benchmarks.md"
    raw.write_text(json.dumps(RAW))
    doc.write_text(f"old\n{peers_report.ANALYSIS_BEGIN}\n## Analysis\n\nkept text\n{md_analysis.ANALYSIS_END}\n")
    assert peers.main(["--from-json", str(raw), "--out", str(doc)]) == 0
    md = doc.read_text()
    assert md_analysis.read_analysis(doc, peers_report.ANALYSIS_BEGIN).strip() == "## Analysis\n\nkept text"
    # trtpipe 8.0 ms vs llama.cpp 9.0 ms (its clean run only; the 0.9-core run is left out)
    assert "| *trtpipe / llama.cpp* | 0.75x | 0.80x | 0.82x | 0.89x | 0.89x | 0.91x |" in md
    assert "| *physical floor* | 19.3 | 155 | 658 | 3.9 | 4.0 | 4.6 |" in md
    assert "| TPOT @16 <= 0.9x fastest peer (llama.cpp) | 8.0 vs 9.0 ms = 0.89x | yes |" in md
    assert "LEFT OUT" in md and "**not run**: setup step 'onnxruntime-genai' failed" in md
    assert "measured 30.0 GB/s and 179 GFLOP/s fp32" in md
    assert "  - int8 peak              217 GOP/s" in md


def test_issue26_targets_by_hand():
    """TTFT and TPOT against the fastest peer whatever its quality (the re-quantized int4 one
    included); spread against the peers' median; RSS against 1.1x (weights + KV pool)."""
    import peers_targets

    def eng(tpot, spread, ttft=(0.03, 0.2, 0.8), tps=100.0, **extra):
        return {
            "ttft_s": dict(zip((16, 128, 512), ttft)),
            "tpot_s": dict(zip((16, 128, 512), tpot)),
            "tps": tps,
            "spread": spread,
            "peak_rss_bytes": 660 * 2**20,
            "extra": extra,
        }

    summary = {
        "trtpipe": eng((0.012, 0.013, 0.015), 1.30, tps=180.0, weights_bytes=2**29, kv_pool_bytes=2**29 // 8),
        "llama.cpp": eng((0.010, 0.010, 0.011), 1.10, tps=60.0),
        "ortgenai-int4": eng((0.006, 0.006, 0.008), 1.20, tps=120.0),
        "ortgenai-fp32": eng((0.020, 0.021, 0.022), 1.05, tps=90.0),
    }
    rows = {what: (measured, met) for what, measured, met, _ in peers_targets.targets(summary, {})}
    # every peer, whatever its quality: ortgenai-int4 (6 ms), not llama.cpp (10 ms): 12 / 6 = 2.0x
    assert rows["TPOT @16 <= 0.9x fastest peer (ortgenai-int4)"] == ("12.0 vs 6.0 ms = 2.00x", False)
    assert rows["TPOT @512 <= 0.9x fastest peer (ortgenai-int4)"] == ("15.0 vs 8.0 ms = 1.88x", False)
    # TTFT against every peer: all equal here, 1.0x > 0.9x (the first of the tied peers)
    assert rows["TTFT @16 <= 0.9x fastest peer (llama.cpp)"][1] is False
    # 180 / 120 = 1.5x meets >= 1.5x
    assert rows["8-request throughput >= 1.5x best peer (ortgenai-int4)"] == ("180 vs 120 tok/s = 1.50x", True)
    # the peers' spreads 1.10, 1.20, 1.05: median 1.10
    assert rows["TPOT spread over runs <= the peers' (median)"] == ("1.30x vs 1.10x", False)
    # 660 MiB / (512 + 64 MiB) = 1.15x > 1.1x
    assert rows["peak RSS <= 1.1x (weights + KV pool)"][1] is False
    assert not any(what.startswith("fast recipe") for what in rows)  # no trtpipe-fast run: no rows

    # the fast recipe's row is trtpipe's, scored against the peers, never a peer itself: its TTFT
    # @512 0.5 s against the fastest peer's 0.8 s = 0.62x; trtpipe's own row still 0.8 / 0.8
    summary["trtpipe-fast"] = eng((0.012, 0.013, 0.015), 1.30, ttft=(0.03, 0.15, 0.5))
    rows = {what: (measured, met) for what, measured, met, _ in peers_targets.targets(summary, {})}
    assert rows["fast recipe: TTFT @512 <= 0.9x fastest peer (llama.cpp)"] == ("500 vs 800 ms = 0.62x", True)
    assert rows["fast recipe: TTFT @128 <= 0.9x fastest peer (llama.cpp)"] == ("150 vs 200 ms = 0.75x", True)
    assert rows["TTFT @512 <= 0.9x fastest peer (llama.cpp)"] == ("800 vs 800 ms = 1.00x", False)
    assert rows["fast recipe: 8-request throughput >= 1.5x best peer (ortgenai-int4)"] == (
        "100 vs 120 tok/s = 0.83x",
        False,
    )


def test_spread_is_the_worst_length_over_runs():
    import peers_measure

    runs = [_run((0.03, 0.2, 0.9), (0.010, 0.010, 0.012), 100.0), _run((0.03, 0.2, 0.9), (0.011, 0.010, 0.015), 100.0)]
    assert peers_measure.summarize({"x": runs})["x"]["spread"] == pytest.approx(0.015 / 0.012)
    assert peers_measure.summarize({"x": runs[:1]})["x"]["spread"] is None


def test_round_order_shuffles_neighbours():
    """Rotated, reversed every other round: every engine's predecessor changes between rounds (a
    plain rotation kept it: the engine after the heaviest one was always the same)."""
    import peers_measure

    engines = ["trtpipe", "llama.cpp", "ortgenai-int4", "ortgenai-fp32", "transformers-fp32"]
    orders = [peers_measure.round_order(engines, r) for r in range(4)]
    assert orders[0] == engines and all(sorted(o) == sorted(engines) for o in orders)
    assert orders[1] == ["trtpipe", "transformers-fp32", "ortgenai-fp32", "ortgenai-int4", "llama.cpp"]
    for e in engines:
        before = {o[o.index(e) - 1] for o in orders if o.index(e) > 0}
        assert len(before) >= 2 or sum(o.index(e) == 0 for o in orders) >= 2, (e, before)


def test_setup_steps_an_engine_needs_include_their_dependencies():
    import peers_setup

    assert peers_setup.steps_needed(["openvino-int4-sym"]) == {
        "openvino",
        "model:hf",
        "model:openvino-int4-sym",
        "common",
    }
    assert peers_setup.steps_needed(["llama.cpp"]) == {"llama.cpp-build", "llama.cpp"}
    assert peers_setup.steps_needed(["trtpipe"]) == set()

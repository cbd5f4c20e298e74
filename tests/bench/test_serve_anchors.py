"""bench/serve.py's anchors comparison without servers: DistServe goodput and the percentiles over
the requests sent (hand-computed), both clients' per-request files turned into records, the
capacity at the SLOs, the report's ratio rows, and llama.cpp's ISA flags chosen from CPU flags."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import peers_llamacpp  # noqa: E402
import serve_anchors_report  # noqa: E402
import serve_clients  # noqa: E402
import serve_goodput  # noqa: E402
import serve_report  # noqa: E402


def _rec(ttft, tpot, gaps=(), ok=True, status=None):
    return {"ok": ok, "ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": list(gaps), "output_tokens": 64, "status": status}


def test_nearest_rank_counts_missing_requests_as_infinite():
    assert serve_goodput.nearest_rank([10, 20, 30, 40], 50) == 20  # rank ceil(0.5 * 4) = 2
    assert serve_goodput.nearest_rank([10, 20, 30, 40], 95) == 40  # rank ceil(3.8) = 4
    # 4 values of 5 sent: p50 = rank 3 = 30; p95 = rank 5 = the unanswered one = inf.
    assert serve_goodput.nearest_rank([40, 10, 30, 20], 50, population=5) == 30
    assert serve_goodput.nearest_rank([10, 20, 30, 40], 95, population=5) == math.inf
    assert serve_goodput.nearest_rank([], 50) is None
    with pytest.raises(ValueError):
        serve_goodput.nearest_rank([1, 2, 3], 50, population=2)


def test_run_figures_by_hand():
    records = [
        _rec(100, 20, gaps=(10, 30)),  # good
        _rec(150, 60, gaps=(60,)),  # TPOT over 50: a miss
        _rec(250, 10, gaps=(5,)),  # TTFT over 200: a miss
        _rec(200, 50, gaps=(100,)),  # both exactly at the budget: good
        _rec(None, None, ok=False, status=503),  # rejected
    ]
    f = serve_goodput.run_figures(records, sent=6, duration_s=4.0)  # one more sent, never finished
    assert (f["sent"], f["done"], f["rejected"], f["failed"], f["unfinished"], f["good"]) == (6, 4, 1, 0, 1, 2)
    assert f["attainment"] == pytest.approx(2 / 6)
    assert f["goodput_rps"] == pytest.approx(0.5)  # 2 good / 4 s
    assert f["output_tokens_per_s"] == pytest.approx(4 * 64 / 4.0)
    # TTFT over 6 sent: 100 150 200 250 inf inf; p50 = rank 3 = 200, p95 = rank 6 = inf.
    assert f["ttft_p50_ms"] == 200 and f["ttft_p95_ms"] == math.inf
    assert f["tpot_p50_ms"] == 50  # 10 20 50 60 inf inf, rank 3
    # gaps 5 10 30 60 100: p99 = rank ceil(4.95) = 5 -> 100
    assert f["itl_p99_ms"] == 100
    with pytest.raises(ValueError):
        serve_goodput.run_figures(records, sent=3, duration_s=1.0)


def test_capacity_is_the_highest_rate_with_90_percent_good():
    assert serve_goodput.capacity_at_slo({0.5: 1.0, 1.0: 0.95, 2.0: 0.9, 4.0: 0.4}) == 2.0
    assert serve_goodput.capacity_at_slo({0.5: 0.89, 1.0: None}) is None


def test_vllm_bench_detailed_file_to_records(tmp_path):
    doc = {
        "duration": 10.0,
        "ttfts": [0.1, 0.0, 0.3],
        "itls": [[0.02, 0.04, 0.03], [], [0.01]],
        "output_lens": [4, 0, 2],
        "errors": ["", "Service Unavailable", ""],
        "latencies": [0.19, 0.0, 0.31],
    }
    (tmp_path / "vllm-bench.json").write_text(json.dumps(doc))
    recs, duration = serve_clients.vllm_bench_records(tmp_path)
    assert duration == 10.0
    assert recs[0]["ttft_ms"] == pytest.approx(100) and recs[0]["tpot_ms"] == pytest.approx(30)  # (190-100) / 3
    assert recs[0]["itl_ms"] == pytest.approx([20, 40, 30])
    assert not recs[1]["ok"] and recs[1]["status"] == 503 and recs[1]["ttft_ms"] is None
    assert recs[2]["tpot_ms"] == pytest.approx(10)


def test_aiperf_records_to_records(tmp_path):
    def line(ttft, itl, n, chunks, err=None, phase="profiling"):
        m = {
            "time_to_first_token": {"value": ttft, "unit": "ms"},
            "inter_token_latency": {"value": itl, "unit": "ms"},
            "output_sequence_length": {"value": n},
            "inter_chunk_latency": {"value": chunks, "unit": "ms"},
        }
        return json.dumps({"metadata": {"benchmark_phase": phase}, "metrics": {} if err else m, "error": err})

    lines = [line(5, 1, 3, [1, 1], phase="warmup"), line(80, 12.5, 3, [10, 15])]
    lines.append(line(None, None, 0, [], err={"code": 503, "message": "queue full"}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "sub" / "profile_export_aiperf.json").write_text(json.dumps({"benchmark_duration": {"avg": 9.5}}))
    recs, duration = serve_clients.aiperf_records(tmp_path)
    assert len(recs) == 2  # the warm-up request is left out
    assert recs[0] == {
        "ok": True,
        "ttft_ms": 80,
        "tpot_ms": 12.5,
        "itl_ms": [10, 15],
        "output_tokens": 3,
        "error": None,
        "status": None,
    }
    assert not recs[1]["ok"] and recs[1]["status"] == 503


def _anchor_raw():
    def run(engine, client, rate, good, ttft95, itl99):
        f = {
            "sent": 10,
            "done": 10,
            "rejected": 0,
            "failed": 0,
            "unfinished": 0,
            "good": good,
            "attainment": good / 10,
            "goodput_rps": good / 10 * rate,
            "output_tokens_per_s": 64.0,
            "duration_s": 10 / rate,
            "ttft_p50_ms": 50.0,
            "ttft_p95_ms": ttft95,
            "tpot_p50_ms": 20.0,
            "tpot_p95_ms": 30.0,
            "itl_p99_ms": itl99,
        }
        return {"engine": engine, "client": client, "load": {"rate": rate}, "figures": f, "foreign_load_cores": 0.1}

    runs = [
        run("trtpipe", "vllm-bench", 1.0, 10, 100.0, 40.0),
        run("vllm", "vllm-bench", 1.0, 9, 200.0, 80.0),
        run("trtpipe", "vllm-bench", 2.0, 9, 150.0, 60.0),
        run("vllm", "vllm-bench", 2.0, 5, math.inf, 90.0),
    ]
    meta = {
        "servers": ["trtpipe", "vllm"],
        "clients": ["vllm-bench"],
        "command": "python bench/serve.py",
        "date": "d",
        "wall_s": 60.0,
        "threads": 2,
        "requests_per_rate": 10,
        "warmup_requests": 2,
        "workload": {"input_tokens": 128, "output_tokens": 64, "seed": 27},
        "slo": {"ttft_ms": 200.0, "tpot_ms": 50.0},
        "machine": {"loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1]},
    }
    return {"format": 2, "meta": meta, "plan": {"rates": [1.0, 2.0], "probe": {}}, "runs": runs}


def test_anchor_report_capacity_and_ratios_by_hand():
    raw = _anchor_raw()
    # trtpipe: 100 % and 90 % good -> capacity 2; vLLM: 90 % then 50 % -> capacity 1.
    assert serve_anchors_report.capacities(raw) == {"vllm-bench": {"trtpipe": 2.0, "vllm": 1.0}}
    md = serve_report.render(raw, "## Analysis\n\nkept")
    assert "| vLLM's benchmark client (`vllm.benchmarks.serve`) | 2.00 req/s | 1.00 req/s | 2.00x |" in md
    ratio1 = next(ln for ln in md.splitlines() if ln.startswith("| 1 | *trtpipe / vllm*"))
    # goodput 1.0 / 0.9 = 1.11x, TTFT p95 100 / 200 = 0.50x, ITL p99 40 / 80 = 0.50x
    assert [c.strip() for c in ratio1.split("|") if c.strip().endswith("x")] == ["1.11x", "0.50x", "0.50x"]
    assert "| 2 | vLLM CPU (bf16) | 10 | 10 | 0 | 0 | 1.00 | 50% | 50 | ∞ |" in md
    assert "kept" in md


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    import serve_plot

    raw = _anchor_raw()
    raw["meta"]["machine"]["cpu"] = "test"
    assert serve_plot.series(raw, "vllm-bench", "vllm", "ttft_p95_ms") == ([1.0], [200.0])  # inf left out
    out = serve_plot.plot(raw, tmp_path / "g.png")
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


ZEN3 = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"}
ZEN4 = ZEN3 | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
XEON_AMX = ZEN4 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def test_llama_isa_flags_follow_the_cpu_and_leave_amx_off():
    z3 = peers_llamacpp.isa_cmake_options(ZEN3)
    assert z3["GGML_AVX2"] and z3["GGML_FMA"] and not z3["GGML_AVX512"] and not z3["GGML_AVX512_VNNI"]
    z4 = peers_llamacpp.isa_cmake_options(ZEN4)
    assert z4["GGML_AVX512"] and z4["GGML_AVX512_BF16"] and not z4["GGML_AVX_VNNI"] and not z4["GGML_AMX_INT8"]
    # AVX-512F alone is not enough: ggml compiles GGML_AVX512 with -mavx512f/cd/vl/dq/bw.
    assert not peers_llamacpp.isa_cmake_options(ZEN3 | {"avx512f"})["GGML_AVX512"]
    x = peers_llamacpp.isa_cmake_options(XEON_AMX)
    assert x["GGML_AVX_VNNI"] and not any(x[k] for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"))
    xa = peers_llamacpp.isa_cmake_options(XEON_AMX, amx=True)
    assert xa["GGML_AMX_TILE"] and xa["GGML_AMX_INT8"] and xa["GGML_AMX_BF16"]
    args = peers_llamacpp.cmake_args(z3)
    assert args[0] == "-DGGML_NATIVE=OFF" and "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=ON" in args


def test_ratio_pairs_put_each_trtpipe_server_against_each_anchor():
    pairs = serve_anchors_report.ratio_pairs
    assert pairs(["trtpipe", "trtpipe-fast", "vllm"]) == [("trtpipe", "vllm"), ("trtpipe-fast", "vllm")]
    assert pairs(["trtpipe", "trtpipe-spec"]) == [("trtpipe", "trtpipe-spec")]  # no anchor: its other config
    raw = _anchor_raw()
    raw["meta"]["servers"] = ["trtpipe", "trtpipe-fast", "vllm"]
    raw["runs"].append(dict(raw["runs"][0], engine="trtpipe-fast"))  # rate 1: the same as trtpipe's
    md = serve_report.render(raw, "## Analysis\n\nkept")
    assert "| trtpipe / vllm | trtpipe-fast / vllm |" in md
    fast1 = next(ln for ln in md.splitlines() if ln.startswith("| 1 | *trtpipe-fast / vllm*"))
    assert [c.strip() for c in fast1.split("|") if c.strip().endswith("x")] == ["1.11x", "0.50x", "0.50x"]
